"""The transactional outbox (django_rtq/outbox.py, its sends in django_rtq/sending.py) in one
process, against a real Redis and the test database (SQLite, or PostgreSQL in CI): rows stored
in the caller's transaction, sent at the commit, kept while Redis is away, relayed once and
only once, and the fallback of plain enqueue(). Real worker processes are in
tests/chaos/test_outbox.py."""

from __future__ import annotations

import logging
import threading

import pytest
from django.core import checks
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_rtq import outbox, sending, signals
from django_rtq.backends import TaskResultStatus
from django_rtq.broker import TaskMessage
from django_rtq.broker.broker import OUTBOX_DROPPED, OUTBOX_SENT, OUTBOX_SENT_BEFORE
from django_rtq.checks import check_tables
from django_rtq.connection import get_broker, note_redis_away, redis_recently_away, reset_broker
from django_rtq.exceptions import BrokerUnavailable, DuplicateTask, TaskIdConflict
from django_rtq.models import OutboxTask
from django_rtq.outbox import OutboxStats, forget_sent, outbox_stats, relay
from django_rtq.registry import announce_enqueued
from django_rtq.testing import capture_tasks
from tests.support.factories import WORKER, claim_ids, done
from tests.support.outbox import make_due
from tests.support.polling import wait_for
from tests.testapp import dtasks, tasks
from tests.testapp.tasks import report_key

pytestmark = pytest.mark.django_db(transaction=True)


def relay_all(broker) -> int:
    return relay(broker, using="default", announce=announce_enqueued)


def live_ids(broker, queue="default") -> set[str]:
    return set(broker.client.hkeys(broker.queue(queue).state))


# Storing and sending


def test_a_task_is_stored_in_the_transaction_and_sent_at_the_commit(broker):
    with transaction.atomic():
        message = tasks.add.enqueue_on_commit(1, 2)
        [row] = OutboxTask.objects.all()
        assert (row.task_id, row.task_name, row.queue) == (message.id, "tests.testapp.tasks.add", "default")
        assert live_ids(broker) == set()

    assert live_ids(broker) == {message.id}
    assert not OutboxTask.objects.exists()
    assert broker.client.zscore(broker.queue("default").outboxed, message.id) is not None


def test_a_rolled_back_transaction_leaves_no_row_and_sends_nothing(broker):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue_on_commit(1, 2)
        raise RuntimeError("the order failed")

    assert not OutboxTask.objects.exists()
    assert live_ids(broker) == set()


def test_a_savepoint_rolled_back_drops_its_task_only(broker):
    with transaction.atomic():
        kept = tasks.add.enqueue_on_commit(1, 2)
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue_on_commit(3, 4)
            raise RuntimeError

    assert live_ids(broker) == {kept.id}
    assert not OutboxTask.objects.exists()


def test_outside_a_transaction_the_task_is_sent_at_once_without_a_row(broker):
    with CaptureQueriesContext(connection) as queries:
        message = tasks.add.enqueue_on_commit(1, 2)

    assert live_ids(broker) == {message.id}
    assert len(queries) == 0


def test_the_send_at_the_commit_costs_one_insert_and_one_delete(broker):
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        tasks.add.enqueue_on_commit(1, 2)

    statements = [
        q["sql"].split()[0].upper() for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    assert [s for s in statements if s in ("INSERT", "DELETE", "UPDATE", "SELECT")] == ["INSERT", "DELETE"]


def test_redis_away_at_the_commit_keeps_the_row_and_raises_nothing(redis_away, caplog):
    caplog.set_level(logging.WARNING, "django_rtq.sending")
    with transaction.atomic():
        message = tasks.add.enqueue_on_commit(1, 2)

    [row] = OutboxTask.objects.all()
    assert row.task_id == message.id
    assert "Redis is unreachable" in caplog.text


def test_after_redis_was_away_the_process_leaves_new_rows_to_the_relay(redis_away, monkeypatch):
    with transaction.atomic():
        tasks.add.enqueue_on_commit(1, 2)
    sends = []
    monkeypatch.setattr(type(get_broker()), "send_outboxed", lambda self, messages: sends.append(messages))

    with transaction.atomic():
        tasks.add.enqueue_on_commit(3, 4)

    assert sends == []  # paused: no request waits on an unreachable Redis again
    assert OutboxTask.objects.count() == 2


def test_outside_a_transaction_redis_away_keeps_the_task_in_the_outbox(redis_away):
    message = tasks.add.enqueue_on_commit(1, 2)

    assert list(OutboxTask.objects.values_list("task_id", flat=True)) == [message.id]


def test_an_id_conflict_or_a_held_lock_at_enqueue_outside_a_transaction_still_raises(broker):
    tasks.add.using(task_id="order-1").enqueue_on_commit(1, 2)
    with pytest.raises(TaskIdConflict):
        tasks.add.using(task_id="order-1").enqueue_on_commit(1, 2)
    tasks.add.using(unique=True).enqueue(5, 6)
    with pytest.raises(DuplicateTask):
        tasks.add.using(unique=True).enqueue_on_commit(5, 6)


def test_outside_a_transaction_a_lost_reply_keeps_the_task_but_never_makes_it_twice(broker, monkeypatch):
    send = type(broker).send_outboxed

    def reply_lost(self, messages):
        send(self, messages)  # Redis took the task...
        raise BrokerUnavailable("Redis is unreachable: the connection broke before the reply")

    monkeypatch.setattr(type(broker), "send_outboxed", reply_lost)
    message = tasks.add.enqueue_on_commit(1, 2)
    monkeypatch.undo()
    assert list(OutboxTask.objects.values_list("task_id", flat=True)) == [message.id]  # ...kept too
    [claimed] = claim_ids(broker, "default")
    broker.complete("default", [done(claimed)], worker_id=WORKER)  # it ran, and left Redis

    reset_broker()  # Redis is back
    make_due()
    assert relay_all(get_broker()) == 1
    assert live_ids(broker) == set()
    assert not OutboxTask.objects.exists()


def test_enqueue_on_commit_in_a_manual_transaction_is_refused_as_on_commit_is(broker):
    transaction.set_autocommit(False)
    try:
        with pytest.raises(TransactionManagementError):
            tasks.add.enqueue_on_commit(1, 2)
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    assert live_ids(broker) == set()


def test_an_id_sent_before_at_the_commit_is_not_sent_again_and_warned_of(broker, caplog):
    caplog.set_level(logging.WARNING, "django_rtq.sending")
    tasks.add.using(task_id="nightly-7").enqueue(1, 2)
    with transaction.atomic():
        tasks.add.using(task_id="nightly-7").enqueue_on_commit(3, 4)

    stored = broker.client.hget(broker.queue("default").msg, "nightly-7")
    assert TaskMessage.from_json(stored, id="nightly-7", queue="default").args == [1, 2]  # the first one
    assert not OutboxTask.objects.exists()
    assert "not sent: a task with its id is in queue 'default'" in caplog.text


def test_forgetting_the_pause_with_the_broker(broker):
    note_redis_away(60)
    assert redis_recently_away()
    reset_broker()
    assert not redis_recently_away()


def test_with_the_outbox_off_the_task_is_sent_at_the_commit_without_a_row(settings, broker):
    settings.RTQ = {**settings.RTQ, "OUTBOX": False}
    with transaction.atomic():
        message = tasks.add.enqueue_on_commit(1, 2)
        assert not OutboxTask.objects.exists()

    assert live_ids(broker) == {message.id}


def test_task_enqueued_is_sent_once_for_a_task_of_the_outbox(broker):
    received = []

    def receiver(sender, message, **kwargs):
        received.append(message.id)

    signals.task_enqueued.connect(receiver)
    try:
        with transaction.atomic():
            message = tasks.add.enqueue_on_commit(1, 2)
    finally:
        signals.task_enqueued.disconnect(receiver)

    assert received == [message.id]


def test_capturing_helpers_see_a_task_of_the_outbox_at_the_commit(broker):
    with capture_tasks() as captured:
        with transaction.atomic():
            message = tasks.add.enqueue_on_commit(1, 2)
            assert list(captured) == []

        assert [m.id for m in captured] == [message.id]
    assert not OutboxTask.objects.exists()
    assert live_ids(broker) == set()


# The relay


def keep_rows(monkeypatch):
    """Make the sender at the commit fail to delete its rows (the database went away, say)."""
    monkeypatch.setattr(sending, "delete_sent", _failing_delete)


def _failing_delete(messages, *, using):
    from django.db import OperationalError

    raise OperationalError("the database went away")


def test_the_relay_sends_rows_redis_never_got_and_deletes_them(redis_away):
    with transaction.atomic():
        first = tasks.add.enqueue_on_commit(1, 2)
    second = tasks.add.enqueue_on_commit(3, 4)  # outside a transaction, kept as well
    broker = redis_away()

    assert relay_all(broker) == 0  # not due yet: the sender's own chance comes first
    make_due()
    assert relay_all(broker) == 2

    assert live_ids(broker) == {first.id, second.id}
    assert not OutboxTask.objects.exists()


def test_a_row_sent_before_is_not_sent_again_even_after_its_task_finished(broker, monkeypatch):
    keep_rows(monkeypatch)
    with transaction.atomic():
        message = tasks.add.enqueue_on_commit(1, 2)
    assert OutboxTask.objects.count() == 1  # sent, but its row is still there
    [claimed] = claim_ids(broker, "default")
    broker.complete("default", [done(claimed)], worker_id=WORKER)  # retention 0: the task is gone
    assert live_ids(broker) == set()
    monkeypatch.undo()

    make_due()
    assert relay_all(broker) == 1

    assert live_ids(broker) == set()  # not made a second time
    assert not OutboxTask.objects.exists()
    assert message.id in broker.client.zrange(broker.queue("default").outboxed, 0, -1)


def test_a_row_whose_task_is_live_is_deleted_without_a_second_task(broker):
    message = tasks.add.using(task_id="receipt-7").enqueue(1, 2)
    outbox.store([message], using="default")
    make_due()

    assert relay_all(broker) == 1
    assert live_ids(broker) == {"receipt-7"}
    assert not OutboxTask.objects.exists()


def test_a_row_whose_unique_lock_is_held_is_dropped_and_logged(broker, caplog):
    caplog.set_level(logging.INFO, "django_rtq.outbox")
    first = tasks.add.using(unique=True).enqueue(1, 2)
    outbox.store([tasks.add.using(unique=True).prepare(1, 2)], using="default")
    make_due()

    assert relay_all(broker) == 1
    assert live_ids(broker) == {first.id}
    assert not OutboxTask.objects.exists()
    assert "dropped: a task with its unique key" in caplog.text


def test_relays_at_once_take_different_rows_each_sent_once(broker, monkeypatch):
    messages = [tasks.add.prepare(i, i) for i in range(1200)]
    outbox.store(messages, using="default")
    make_due()
    sent: list[str] = []  # every id any relay passed to Redis
    send = type(broker).send_outboxed

    def counted(self, batch):
        sent.extend(message.id for message in batch)
        return send(self, batch)

    monkeypatch.setattr(type(broker), "send_outboxed", counted)
    errors = []

    def one_relay():
        try:
            while relay(broker, using="default", announce=announce_enqueued, limit=50):
                pass
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    relays = [threading.Thread(target=one_relay) for _ in range(3)]
    for thread in relays:
        thread.start()
    for thread in relays:
        thread.join(60)
    if connection.vendor == "sqlite":
        # SQLite serializes writers: a relay may find the database locked, and try on its next pass.
        errors = [e for e in errors if "locked" not in str(e)]
        while relay_all(broker):
            pass

    assert errors == []
    assert sorted(sent) == sorted(m.id for m in messages)  # the leases: no row sent twice
    assert broker.client.zcard(broker.queue("default").pending) == 1200
    assert not OutboxTask.objects.exists()


def test_a_relay_that_died_leaves_its_rows_to_another_after_the_lease(broker, monkeypatch):
    messages = [tasks.add.prepare(i, i) for i in range(3)]
    outbox.store(messages, using="default")
    make_due()
    assert len(outbox._take(using="default", lease="dead-relay", limit=10)) == 3  # then it died

    assert relay_all(broker) == 0  # leased
    make_due()  # the lease ran out
    assert relay_all(broker) == 3
    assert live_ids(broker) == {m.id for m in messages}


def test_redis_away_during_a_relay_makes_its_rows_due_again_at_once(broker, monkeypatch):
    outbox.store([tasks.add.prepare(1, 2)], using="default")
    make_due()

    def away(self, messages):
        raise BrokerUnavailable("Redis is unreachable: test")

    monkeypatch.setattr(type(broker), "send_outboxed", away)
    with pytest.raises(BrokerUnavailable):
        relay_all(broker)
    monkeypatch.undo()

    [row] = OutboxTask.objects.all()
    assert row.lease == "" and row.next_attempt_at <= timezone.now()
    assert relay_all(broker) == 1


def test_a_corrupt_row_is_kept_with_its_error_and_tried_later(broker, caplog):
    good = tasks.add.prepare(1, 2)
    outbox.store([good], using="default")
    OutboxTask.objects.create(
        task_id="bad-1",
        task_name="x",
        queue="default",
        message="{not json",
        created_at=timezone.now(),
        next_attempt_at=timezone.now(),
    )
    make_due()

    assert relay_all(broker) == 2

    assert live_ids(broker) == {good.id}
    [bad] = OutboxTask.objects.all()
    assert bad.task_id == "bad-1" and bad.attempts == 1 and bad.lease == ""
    assert "not a task message" in bad.last_error
    assert bad.next_attempt_at > timezone.now()
    assert relay_all(broker) == 0  # backing off
    assert "could not be sent (attempt 1)" in caplog.text


def test_a_wrong_typed_key_fails_its_queue_only_and_is_recorded(broker):
    broker.client.set(broker.queue("low").outboxed, "garbage")
    ok = tasks.add.prepare(1, 2)
    stuck = tasks.add.using(queue="low").prepare(3, 4)
    outbox.store([ok, stuck], using="default")
    make_due()

    assert relay_all(broker) == 2

    assert live_ids(broker) == {ok.id}
    [row] = OutboxTask.objects.all()
    assert row.task_id == stuck.id and "not a sorted set" in row.last_error


def test_the_relay_forgets_sent_ids_once_their_rows_are_gone(broker, monkeypatch):
    keep_rows(monkeypatch)
    with transaction.atomic():
        kept = tasks.add.enqueue_on_commit(1, 2)
    monkeypatch.undo()
    with transaction.atomic():
        gone = tasks.add.enqueue_on_commit(3, 4)
    key = broker.queue("default").outboxed
    assert set(broker.client.zrange(key, 0, -1)) == {kept.id, gone.id}

    assert forget_sent(broker, using="default") == 0  # too recent
    broker.client.zadd(key, {kept.id: 1, gone.id: 1})  # sent long ago
    assert forget_sent(broker, using="default") == 1

    assert broker.client.zrange(key, 0, -1) == [kept.id]  # its row is still there


def test_the_send_outboxed_outcomes(broker):
    first = tasks.add.prepare(1, 2)
    locked = tasks.add.using(unique=True).prepare(5, 6)
    tasks.add.using(unique=True).enqueue(5, 6)

    assert broker.send_outboxed([first, first, locked]) == [OUTBOX_SENT, OUTBOX_SENT_BEFORE, OUTBOX_DROPPED]
    assert broker.send_outboxed([first]) == [OUTBOX_SENT_BEFORE]


# The fallback of plain enqueue()


def test_plain_enqueue_raises_while_redis_is_away_without_the_fallback(redis_away):
    with pytest.raises(BrokerUnavailable):
        tasks.add.enqueue(1, 2)
    assert not OutboxTask.objects.exists()


def test_with_the_fallback_plain_enqueue_keeps_its_tasks_in_the_outbox(redis_away, settings, caplog):
    settings.RTQ = {**settings.RTQ, "OUTBOX_FALLBACK": True}
    caplog.set_level(logging.INFO, "django_rtq.outbox")

    message = tasks.add.enqueue(1, 2)
    many = tasks.add.prepare(3, 4), tasks.add.prepare(5, 6)
    from django_rtq import enqueue_many

    enqueue_many(many)

    assert set(OutboxTask.objects.values_list("task_id", flat=True)) == {message.id, *(m.id for m in many)}
    assert "kept in the outbox" in caplog.text


def test_with_the_fallback_a_database_down_too_raises_broker_unavailable(redis_away, settings, monkeypatch):
    from django.db import OperationalError

    settings.RTQ = {**settings.RTQ, "OUTBOX_FALLBACK": True}

    def down(messages, *, using):
        raise OperationalError("the database is down too")

    monkeypatch.setattr(outbox, "store", down)
    with pytest.raises(BrokerUnavailable, match="could not store"):
        tasks.add.enqueue(1, 2)


# django.tasks


def test_the_backend_with_outbox_sends_a_task_enqueued_in_a_transaction_at_the_commit(outbox_backend, broker):
    with transaction.atomic():
        result = dtasks.multiply.enqueue(2, 3)
        assert OutboxTask.objects.filter(task_id=result.id).exists()
        assert result.id not in live_ids(broker)

    assert result.id in live_ids(broker)
    assert not OutboxTask.objects.exists()


def test_the_backend_reports_a_task_waiting_in_the_outbox_as_ready(outbox_backend, broker, monkeypatch):
    note_redis_away(60)  # Redis was away moments ago: the task is left to the relay
    with transaction.atomic():
        result = dtasks.multiply.enqueue(2, 3)

    found = dtasks.multiply.get_result(result.id)
    assert (found.status, found.args) == (TaskResultStatus.READY, [2, 3])
    assert OutboxTask.objects.filter(task_id=result.id).exists()


def test_the_backend_finds_a_task_of_the_outbox_while_redis_is_away(outbox_backend, redis_away):
    with transaction.atomic():
        result = dtasks.multiply.enqueue(2, 3)

    assert dtasks.multiply.get_result(result.id).status == TaskResultStatus.READY
    with pytest.raises(BrokerUnavailable):
        dtasks.multiply.get_result("not-in-the-outbox")


def test_the_backend_with_outbox_sends_task_enqueued_at_the_commit_only(outbox_backend, broker):
    from django_rtq.backends import task_enqueued

    received = []

    def receiver(sender, task_result, **kwargs):
        received.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            dtasks.multiply.enqueue(2, 3)
            raise RuntimeError("rolled back")
        assert received == []
        with transaction.atomic():
            result = dtasks.multiply.enqueue(2, 3)
            assert received == []
        assert received == [result.id]
    finally:
        task_enqueued.disconnect(receiver)


def test_the_backend_without_the_option_sends_at_once(broker):
    with transaction.atomic():
        result = dtasks.multiply.enqueue(2, 3)
        assert result.id in live_ids(broker)
    assert not OutboxTask.objects.exists()


def test_on_commit_with_enqueue_keeps_working_as_django_documents_it(outbox_backend, broker):
    from functools import partial

    results = []
    with transaction.atomic():
        transaction.on_commit(partial(lambda: results.append(dtasks.multiply.enqueue(2, 3))))
    [result] = results
    assert result.id in live_ids(broker)


def test_the_backend_refuses_an_outbox_option_that_is_not_a_bool():
    from django.core.exceptions import ImproperlyConfigured

    from django_rtq.backends import RTQBackend

    with pytest.raises(ImproperlyConfigured, match="must be True or False"):
        RTQBackend("x", {"OPTIONS": {"OUTBOX": "yes"}})


# Visible


def test_outbox_stats_count_the_rows_their_oldest_and_the_failing(broker):
    assert outbox_stats() == OutboxStats(waiting=0, oldest=None, failing=0)
    outbox.store([tasks.add.prepare(1, 2), tasks.add.prepare(3, 4)], using="default")
    OutboxTask.objects.filter(pk=OutboxTask.objects.first().pk).update(attempts=2)

    stats = outbox_stats()
    assert (stats.waiting, stats.failing) == (2, 1)
    assert 0 <= stats.age_seconds() < 60


def test_the_check_warns_when_the_outbox_table_is_missing(monkeypatch):
    assert check_tables(databases=["default"]) == []
    assert check_tables(databases=None) == []
    monkeypatch.setattr(type(connection.introspection), "table_names", lambda self, cursor=None: [])

    [warning] = check_tables(databases=["default"])
    assert warning.id == "django_rtq.W008" and isinstance(warning, checks.Warning)
    assert "django_rtq_outboxtask" in warning.msg


# The worker's relay


def test_a_worker_relays_the_outbox_and_runs_its_tasks(run_worker, broker, redis_client):
    outbox.store([tasks.record.prepare("relayed", i) for i in range(5)], using="default")
    make_due()

    with run_worker(relay=True):
        wait_for(lambda: len(redis_client.lrange(report_key("relayed"), 0, -1)) == 5, message="5 runs")

    assert sorted(redis_client.lrange(report_key("relayed"), 0, -1)) == ["0", "1", "2", "3", "4"]
    assert not OutboxTask.objects.exists()


def test_a_burst_worker_relays_the_due_rows_runs_their_tasks_then_exits(broker, redis_client):
    from django_rtq.worker.server import Worker

    # More than a relay's batch: a relay thread beside the drain used to lose the race (#27).
    outbox.store([tasks.record.prepare("burst-relayed", i) for i in range(600)], using="default")
    make_due()

    done = threading.Event()
    worker = Worker(broker=broker, queues={"default": 1}, burst=True, relay=True)
    runner = threading.Thread(target=lambda: (worker.run(), done.set()))
    runner.start()
    runner.join(timeout=30)
    if not done.is_set():
        worker.request_stop()
        runner.join()

    assert done.is_set(), "the burst worker did not exit"
    assert sorted(map(int, redis_client.lrange(report_key("burst-relayed"), 0, -1))) == list(range(600))
    assert not OutboxTask.objects.exists()


def test_the_relay_warns_once_while_the_database_is_away(broker, monkeypatch, caplog):
    from django.db import OperationalError

    from django_rtq.worker.relay import Relay

    component = Relay(broker=broker, interval=1.0)
    passes = iter([OperationalError("down"), OperationalError("down"), 0])

    def fake_relay(broker, *, using, announce, limit=500):
        outcome = next(passes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr("django_rtq.worker.relay.relay", fake_relay)
    caplog.set_level(logging.WARNING, "django_rtq.worker.relay")

    assert [component.run_once() for _ in range(3)] == [0, 0, 0]

    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot read the outbox" in m for m in messages) == 1
    assert sum("can be read again" in m for m in messages) == 1


# What the review found


def test_a_unique_task_whose_send_failed_half_way_is_not_dropped_by_its_own_lock(broker):
    message = tasks.add.using(unique=True).prepare(1, 2)
    lock = broker.queue("default").unique(message.unique_key)
    broker.client.set(lock, message.id)  # written before the send's error

    assert broker.send_outboxed([message]) == [OUTBOX_SENT]
    assert live_ids(broker) == {message.id}


def test_the_relay_forgets_sent_ids_page_after_page_past_those_whose_rows_remain(broker):
    key = broker.queue("default").outboxed
    ids = [f"old-{i:04}" for i in range(1300)]
    broker.client.zadd(key, dict.fromkeys(ids, 1))  # sent long ago
    broker.register_queues(["default"])
    kept = [tasks.add.using(task_id=task_id).prepare(1, 2) for task_id in ids[:600]]
    outbox.store(kept, using="default")  # the oldest 600 still have rows

    assert forget_sent(broker, using="default") == 700

    assert broker.client.zrange(key, 0, -1) == ids[:600]


def test_an_eager_run_of_a_task_enqueued_on_commit_raises_its_error(broker):
    from django_rtq.testing import run_eagerly

    with run_eagerly(), pytest.raises(ValueError, match="always fails"), transaction.atomic():
        tasks.always_fails.enqueue_on_commit("eager")


def test_an_async_caller_whose_fallback_cannot_store_gets_broker_unavailable(
    redis_away, settings, monkeypatch
):
    import asyncio

    settings.RTQ = {**settings.RTQ, "OUTBOX_FALLBACK": True}
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)  # the browser tests set it

    async def view():
        tasks.add.enqueue(1, 2)

    with pytest.raises(BrokerUnavailable, match="could not store"):
        asyncio.run(view())


def test_the_outbox_check_runs_only_when_databases_are_asked_for():
    from django.core.checks import run_checks

    # Django 6 gives every database to the checks of a tag: this one is not under django_rtq's.
    assert "check_tables" not in [
        c.__name__ for c in checks.registry.registry.get_checks() if "django_rtq" in c.tags
    ]
    assert all(m.id != "django_rtq.W008" for m in run_checks(databases=["default"]))

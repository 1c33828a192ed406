"""The ORM mirror of finished tasks: records buffered by the finishing script, written in
batches by the worker, exactly once, through a database outage; and the prune command."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.utils import timezone

from django_rtq.broker import TaskMessage, TaskState, manual
from django_rtq.mirror import mirror_batch
from django_rtq.models import FinishedTask
from django_rtq.worker.mirrorer import BACKLOG_STEP, BUSY_SHARE, MAX_BUSY_SHARE, Mirrorer, busy_share
from tests.support.factories import WORKER, claim_ids, done, fail, message
from tests.support.polling import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def small_mirror_batches(settings):
    """Mirror in batches of 20, so that a few dozen tasks take several."""
    settings.RTQ = {**settings.RTQ, "MIRROR_BATCH_SIZE": 20}


def buffered(broker, queue="default") -> int:
    return broker.client.hlen(broker.queue(queue).finished)


def test_finished_tasks_are_mirrored_with_their_outcome(mirroring, broker, run_worker):
    added = tasks.add.using(retention=0).enqueue(2, 3)
    failed = tasks.always_fails.using(max_retries=1).enqueue("mirror")
    with run_worker():
        wait_for(lambda: FinishedTask.objects.count() == 2, message="two mirrored rows")
    ok = FinishedTask.objects.get(pk=added.id)
    assert (ok.status, ok.return_value, ok.task_name, ok.queue) == ("succeeded", 5, added.task, "default")
    assert (ok.args, ok.kwargs, ok.attempts, ok.error_class) == ([2, 3], {}, 1, "")
    assert ok.worker and ok.enqueued_at <= ok.started_at <= ok.finished_at
    assert abs(ok.duration - (ok.finished_at - ok.started_at)) < timedelta(milliseconds=1)

    bad = FinishedTask.objects.get(pk=failed.id)
    assert (bad.status, bad.return_value, bad.attempts) == ("failed", None, 2)
    assert bad.error_class == "builtins.ValueError"
    assert "always_fails" in bad.traceback and bad.error_message
    assert buffered(broker) == 0


def test_nothing_is_buffered_when_mirroring_is_off(settings, broker, run_worker, inspector):
    assert not broker.mirror
    message = tasks.add.using(retention=0).enqueue(1, 1)
    with run_worker():
        wait_for(lambda: inspector.queue_stats("default").processed_today == 1)
    assert buffered(broker) == 0
    assert not FinishedTask.objects.filter(pk=message.id).exists()


def test_tasks_finishing_while_the_database_is_down_appear_once_it_is_back(
    mirroring, broker, run_worker, database_outage
):
    with run_worker() as worker:
        database_outage.down()
        try:
            succeeded = [tasks.add.using(retention=0).enqueue(i, i).id for i in range(45)]
            failed = [tasks.always_fails.using(max_retries=0).enqueue(f"outage-{i}").id for i in range(5)]
            wait_for(lambda: buffered(broker) == 50, timeout=30, message="50 finished tasks buffered")
            wait_for(lambda: worker.mirrorer._database_down, timeout=15, message="the mirror to fail")
            assert buffered(broker) == 50
        finally:
            database_outage.up()
        wait_for(lambda: buffered(broker) == 0, timeout=30, message="the buffer to drain")
    rows = dict(FinishedTask.objects.values_list("task_id", "status"))
    assert rows == {**dict.fromkeys(succeeded, "succeeded"), **dict.fromkeys(failed, "failed")}


def test_an_archived_task_run_again_is_mirrored_with_its_new_outcome(mirroring, broker, run_worker):
    first = tasks.flaky.using(max_retries=0).enqueue("again", 1)
    with run_worker():
        wait_for(lambda: FinishedTask.objects.filter(pk=first.id, status="failed").exists())
        assert manual.run_now(broker, "default", [first.id]) == 1
        wait_for(lambda: FinishedTask.objects.filter(pk=first.id, status="succeeded").exists())
    row = FinishedTask.objects.get(pk=first.id)
    assert (row.return_value, row.attempts, row.error_class) == (2, 2, "")


def test_a_record_replaced_after_it_was_taken_stays_buffered(mirroring, broker):
    broker.enqueue([message("default", id="again")])
    [task_id] = claim_ids(broker, "default")
    broker.complete("default", [done(task_id)], worker_id=WORKER)
    records = broker.take_finished("default", worker_id="mirror-a", lock_ms=10_000, limit=10)
    assert [task_id for task_id, _ in records] == ["again"]

    # The task is enqueued and finishes again (failing, this time) before the ack.
    broker.enqueue([message("default", id="again")])
    claim_ids(broker, "default")
    fail(broker, "default", "again", TaskState.ARCHIVED)
    assert broker.ack_finished("default", records, worker_id="mirror-a") == 0
    assert buffered(broker) == 1
    [(_, record)] = broker.take_finished("default", worker_id="mirror-a", lock_ms=10_000, limit=10)
    assert '"status":"failed"' in record
    assert broker.ack_finished("default", [("again", record)], worker_id="mirror-a") == 1
    assert broker.ack_finished("default", [("again", record)], worker_id="mirror-a") == 0


def test_one_worker_at_a_time_mirrors_a_queue(mirroring, broker):
    broker.enqueue([message("default") for _ in range(3)])
    broker.complete("default", [done(i) for i in claim_ids(broker, "default")], worker_id=WORKER)
    assert len(broker.take_finished("default", worker_id="a", lock_ms=10_000, limit=10)) == 3
    assert broker.take_finished("default", worker_id="b", lock_ms=10_000, limit=10) is None
    broker.ack_finished("default", [], worker_id="a", release=True)
    assert len(broker.take_finished("default", worker_id="b", lock_ms=10_000, limit=10)) == 3


def test_mirroring_twice_writes_each_task_once(mirroring, broker):
    broker.enqueue([message("default") for _ in range(5)])
    ids = claim_ids(broker, "default")
    broker.complete("default", [done(i) for i in ids], worker_id=WORKER)
    records = broker.take_finished("default", worker_id="a", lock_ms=10_000, limit=10)
    # A mirror that wrote the rows but died before its ack: the next one writes them again.
    from django_rtq.mirror import values_from_record, write_rows

    write_rows([values_from_record(i, "default", r) for i, r in records])
    assert mirror_batch(broker, "default", worker_id="a", limit=10, lock_ms=1000) == 5
    assert sorted(FinishedTask.objects.values_list("task_id", flat=True)) == sorted(ids)
    assert buffered(broker) == 0


def test_a_corrupt_archived_task_is_mirrored_as_failed(mirroring, broker, run_worker):
    qk = broker.queue("default")
    broker.enqueue([message("default", id="corrupt")])
    broker.client.hset(qk.msg, "corrupt", "{not json")
    with run_worker():
        wait_for(lambda: FinishedTask.objects.filter(pk="corrupt").exists())
    row = FinishedTask.objects.get(pk="corrupt")
    assert row.status == "failed" and "corrupt" in row.error_message


def test_text_the_database_refuses_is_stored_sanitized(mirroring, broker):
    broker.enqueue([message("default", id="nul", args=["a\x00b"])])
    claim_ids(broker, "default")
    broker.complete("default", [done("nul", result="x\x00y")], worker_id=WORKER)
    assert mirror_batch(broker, "default", worker_id="a", limit=10, lock_ms=1000) == 1
    row = FinishedTask.objects.get(pk="nul")
    assert row.return_value in ("x\x00y", "xy") and row.args in (["a\x00b"], ["ab"])


def test_prune_deletes_rows_older_than_the_setting(settings, prefix):
    settings.RTQ = {**settings.RTQ, "MIRROR_MAX_AGE": 3600}
    now = timezone.now()
    for name, age in (("old", timedelta(hours=2)), ("new", timedelta(minutes=5))):
        FinishedTask.objects.create(
            task_id=name, task_name="t", queue="q", status="succeeded", finished_at=now - age
        )
    call_command("rtq_prune")
    assert list(FinishedTask.objects.values_list("task_id", flat=True)) == ["new"]
    call_command("rtq_prune", "--older-than", "60")
    assert not FinishedTask.objects.exists()


def test_message_json_is_what_the_mirror_reads():
    # The mirror reads these message fields by name from the buffered record.
    assert {"task", "args", "kwargs", "priority", "enqueued_at", "parent"} <= set(TaskMessage.__slots__)


def test_the_mirror_takes_a_larger_share_of_a_busy_worker_as_its_backlog_grows():
    assert busy_share(0) == busy_share(BACKLOG_STEP) == BUSY_SHARE
    assert busy_share(4 * BACKLOG_STEP) == pytest.approx(4 * BUSY_SHARE)
    assert busy_share(10**9) == MAX_BUSY_SHARE


def test_the_mirror_stops_yielding_once_the_worker_is_idle(mirroring, broker):
    looks = iter([True, True, False])
    mirrorer = Mirrorer(
        broker=broker, worker_id=WORKER, queues=["default"], interval=1, batch_size=10,
        busy=lambda: next(looks, False),
    )  # fmt: skip
    yielding = threading.Thread(target=mirrorer._yield_to_tasks, args=("default", 3600.0))
    yielding.start()
    yielding.join(timeout=10)  # a batch of an hour would otherwise make it wait for days
    assert not yielding.is_alive()


@pytest.fixture
def no_table():
    """The finished tasks' table dropped, as in a project that has not run `migrate`."""
    with connection.schema_editor() as editor:
        editor.delete_model(FinishedTask)
    yield
    with connection.schema_editor() as editor:
        editor.create_model(FinishedTask)


def test_finished_tasks_wait_in_redis_until_the_table_is_migrated(mirroring, broker, no_table):
    broker.enqueue([message("default") for _ in range(3)])
    ids = claim_ids(broker, "default")
    broker.complete("default", [done(i) for i in ids], worker_id=WORKER)
    # SQLite says "no such table" as an OperationalError; PostgreSQL as a ProgrammingError,
    # which the mirror must not take for rows to drop.
    with pytest.raises(OperationalError, match=r"no such table|is missing in database 'default'"):
        mirror_batch(broker, "default", worker_id="a", limit=10, lock_ms=1)
    assert buffered(broker) == 3

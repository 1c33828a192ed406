"""The worker under faults it did not plan for, in this process against a real Redis: shutdown
with handlers still running, hand-offs to a full worker, lost leases, errors other than a lost
connection, and data of the wrong shape."""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from django_rtq import signals
from django_rtq.broker import Broker, TaskState
from django_rtq.broker.errors import translate_errors
from django_rtq.connection import get_broker, reset_broker
from django_rtq.exceptions import BrokerUnavailable
from django_rtq.worker.server import Worker
from tests.support.polling import wait_for
from tests.support.runs import reports, wait_state
from tests.testapp import tasks


def started(redis_client, name):
    return wait_for(lambda: reports(redis_client, f"{name}:started"), timeout=10, message=f"{name} to start")


# Shutdown


def test_shutdown_gives_back_a_running_task_only_once_its_handler_stopped(broker, inspector, redis_client):
    message = tasks.hold.enqueue("held")
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=1, shutdown_timeout=0.2)
    worker.start()
    started(redis_client, "held")
    worker.stop()
    # The handler saw its task still active as it left: it was given back after, not before.
    assert reports(redis_client, "held:left") == ["active"]
    back = inspector.get_task(message.id)
    assert back.state == TaskState.PENDING and back.retried == 0


def test_shutdown_gives_back_tasks_that_had_not_started_at_once(broker, inspector, redis_client):
    first = tasks.hold.enqueue("first")
    waiting = tasks.record.enqueue("never")
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=1, shutdown_timeout=5)
    worker.start()
    started(redis_client, "first")
    wait_for(lambda: worker.processor.jobs.queued == 1, message="the second task to wait in memory")
    stopping = threading.Thread(target=worker.stop)
    stopping.start()
    # While the first still runs (up to the shutdown timeout), the waiting one is already back.
    wait_state(inspector, waiting.id, TaskState.PENDING)
    assert inspector.get_task(first.id).state == TaskState.ACTIVE
    redis_client.set(tasks.report_key("release:first"), "1")
    stopping.join(10)
    assert reports(redis_client, "never") == []


def test_a_handler_that_ignores_the_shutdown_keeps_its_task(broker, inspector, redis_client):
    message = tasks.sleep_in_c.enqueue("stubborn", 4)
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=1, shutdown_timeout=0.1)
    worker.start()
    started(redis_client, "stubborn")
    worker.stop()
    # Its handler is still asleep in C: giving the task back would let another worker run it
    # at the same time. It stays active until its lease runs out (after this worker exits).
    assert inspector.get_task(message.id).state == TaskState.ACTIVE
    assert reports(redis_client, "stubborn") == []


# Hand-offs


def test_a_task_handed_to_a_worker_that_filled_up_is_given_back(broker, inspector, redis_client):
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=1)
    waiting = [f"waiting-{i}" for i in range(worker.processor.capacity - 1)]
    tasks.hold.enqueue("busy")
    for name in waiting:  # with these, the worker holds all it may: it is full
        tasks.hold.enqueue(name)
    worker.start()
    try:
        started(redis_client, "busy")
        wait_for(
            lambda: worker.processor.jobs.queued == len(waiting), message="the other tasks to wait in memory"
        )
        qk = broker.queue("default")
        # As if its last claim had come back short just before it filled up.
        broker.client.zadd(qk.idle, {worker.id: broker.server_now_ms() + 60_000})
        handed = tasks.record.enqueue("handed", 1)
        wait_for(lambda: broker.client.zscore(qk.idle, worker.id) is None, message="the hand-off")
        wait_for(
            lambda: inspector.get_task(handed.id).state == TaskState.PENDING,
            message="the hand-off given back",
        )
        assert broker.client.hget(qk.owner, handed.id) is None
        for name in ["busy", *waiting]:
            redis_client.set(tasks.report_key(f"release:{name}"), "1")
        wait_for(lambda: reports(redis_client, "handed") == ["1"], message="the given-back task to run")
    finally:
        worker.stop()


# Lost leases


class LeasesRefused:
    """A broker whose lease renewals fail, as if this worker alone had lost Redis."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.refusing = False

    def extend_leases(self, *args, **kwargs):
        if self.refusing:
            raise BrokerUnavailable("simulated partition")
        return self._broker.extend_leases(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._broker, name)


def test_a_worker_that_cannot_renew_its_leases_stops_its_tasks_in_time(
    broker, inspector, redis_client, prefix
):
    short = Broker(broker.client, prefix=prefix, lease_seconds=1.5)
    refusing = LeasesRefused(short)
    message = tasks.hold.enqueue("cut-off")
    worker = Worker(broker=refusing, queues={"default": 1}, concurrency=1)
    worker.start()
    try:
        started(redis_client, "cut-off")
        refusing.refusing = True
        left = wait_for(
            lambda: reports(redis_client, "cut-off:left"), timeout=5, message="the handler to stop"
        )
        # It stopped while its lease was still valid, so no other worker could have run it yet.
        assert left == ["active"]
        assert broker.client.zscore(broker.queue("default").active, message.id) > broker.server_now_ms() - 500
        # Nothing was settled as a failure: once its handler stopped, the worker gave the task
        # back (Redis answers it, only renewals fail here), and it ran again.
        qk = broker.queue("default")
        wait_for(lambda: broker.client.hget(qk.runs, message.id) == "2", message="the task to run again")
        assert inspector.get_task(message.id).retried == 0
        assert inspector.queue_stats("default").failed_today == 0
    finally:
        worker.stop()


# Errors other than a lost connection


# Replies of a Redis away for a while (LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, OOM, READONLY),
# made by real servers: tests/test_redis_away_replies.py, tests/test_redis_full_or_read_only.py.


def test_other_replies_are_not_unavailability(redis_client, prefix):
    key = f"{prefix}:a-string"
    redis_client.set(key, "not a sorted set")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"), translate_errors():
        redis_client.zadd(key, {"member": 1})


class CompletionRefused:
    """A broker whose first completion fails with an error Redis would not repeat."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.refused = 0

    def complete(self, *args, **kwargs):
        if not self.refused:
            self.refused += 1
            raise redis.ResponseError("ERR Error running script: something unexpected")
        return self._broker.complete(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._broker, name)


def test_a_write_that_fails_for_another_reason_leaves_the_task_to_the_recoverer(
    broker, inspector, redis_client
):
    refusing = CompletionRefused(broker)
    first = tasks.record.enqueue("first", 1)
    worker = Worker(broker=refusing, queues={"default": 1}, concurrency=1)
    worker.start()
    try:
        wait_for(lambda: refusing.refused == 1)
        second = tasks.record.enqueue("second", 2)
        wait_for(lambda: reports(redis_client, "second") == ["2"], message="the worker to go on")
        wait_for(lambda: worker.processor.owned_by_queue() == {}, message="the worker to let go of the first")
        # Its lease is no longer renewed: once it expires, the recoverer gives it to a worker.
        assert inspector.get_task(first.id).state == TaskState.ACTIVE
        wait_for(lambda: state_or_none(inspector, second.id) is None)
    finally:
        worker.stop()


def state_or_none(inspector, task_id):
    from django_rtq.exceptions import TaskNotFound

    try:
        return inspector.get_task(task_id).state
    except TaskNotFound:
        return None


def test_a_retry_backoff_that_raises_falls_back_to_the_default(run_worker, inspector, redis_client):
    message = tasks.fails_with_a_broken_backoff.enqueue("broken")
    with run_worker():
        retrying = wait_state(inspector, message.id, TaskState.RETRY)
    assert retrying.retried == 1 and retrying.last_error == "it fails"
    assert retrying.score_at > 0


def test_a_signal_receiver_that_raises_neither_fails_the_task_nor_stops_the_worker(run_worker, inspector):
    def broken(**kwargs):
        raise RuntimeError("a broken receiver")

    for signal in (signals.task_started, signals.task_succeeded, signals.task_failed, signals.task_retried):
        signal.connect(broken, dispatch_uid="broken-receiver")
    try:
        good = tasks.add.enqueue(2, 3)
        bad = tasks.fails_with_a_broken_backoff.enqueue("signalled")
        with run_worker():
            done = wait_state(inspector, good.id, TaskState.COMPLETED)
            wait_state(inspector, bad.id, TaskState.RETRY)
    finally:
        for signal in (
            signals.task_started,
            signals.task_succeeded,
            signals.task_failed,
            signals.task_retried,
        ):
            signal.disconnect(dispatch_uid="broken-receiver")
    assert done.result == 5


# Data of the wrong shape


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout", "5"),
        ("args", {}),
        ("kwargs", []),
        ("deadline", "soon"),
        ("max_retries", None),
        ("priority", True),
    ],
)
def test_a_message_with_a_wrong_typed_field_is_archived_and_the_worker_goes_on(
    run_worker, inspector, broker, redis_client, field, value
):
    import json

    bad = tasks.record.enqueue("bad", 1)
    qk = broker.queue("default")
    body = json.loads(broker.client.hget(qk.msg, bad.id))
    broker.client.hset(qk.msg, bad.id, json.dumps({**body, field: value}))
    with run_worker(concurrency=1):
        archived = wait_state(inspector, bad.id, TaskState.ARCHIVED)
        good = tasks.record.enqueue("good", 2)
        wait_for(lambda: reports(redis_client, "good") == ["2"], message="a good task after the bad one")
    assert field in archived.last_error and "corrupt" in archived.last_error
    assert reports(redis_client, "bad") == []
    assert good


def test_corrupt_info_is_set_aside_with_a_warning_and_the_task_runs(
    run_worker, inspector, broker, redis_client, caplog
):
    message = tasks.record.enqueue("info", 1)
    broker.client.hset(broker.queue("default").info, message.id, "{not json")
    with caplog.at_level(logging.WARNING, logger="django_rtq"), run_worker():
        wait_for(lambda: reports(redis_client, "info") == ["1"])
    assert any("its info is not JSON" in record.getMessage() for record in caplog.records)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_whose_thread_died_stops_with_a_non_zero_status(broker, monkeypatch):
    worker = Worker(broker=broker, queues={"default": 1})

    def die():
        raise SystemExit("a thread that dies")  # not an Exception: the component's loop ends

    monkeypatch.setattr(worker.janitor, "run_once", die)
    status = []
    runner = threading.Thread(target=lambda: status.append(worker.run()))
    runner.start()
    runner.join(20)
    assert status == [1]


def test_lease_seconds_reaches_the_process_broker(settings, prefix):
    settings.RTQ = {**settings.RTQ, "LEASE_SECONDS": 7}
    reset_broker()
    assert get_broker().lease_ms == 7000

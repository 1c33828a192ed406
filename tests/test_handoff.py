"""Handing a task enqueued to an empty queue straight to an idle worker."""

from __future__ import annotations

import pytest

from django_rtq.broker import TaskMessage, TaskState
from django_rtq.worker.server import Worker
from tests.support.polling import wait_for
from tests.testapp import tasks


@pytest.fixture
def listener(broker):
    """A pub/sub connection listening as worker 'w1' would for its hand-offs."""
    pubsub = broker.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(broker.queue("default").handoff_channel("w1"))
    wait_for(lambda: broker.client.pubsub_numsub(broker.queue("default").handoff_channel("w1"))[0][1] == 1)
    yield pubsub
    pubsub.close()


def go_idle(broker, worker_id="w1"):
    assert broker.claim("default", worker_id=worker_id, limit=5, idle_for_ms=5_000) == []


def test_a_short_claim_registers_the_worker_as_idle_and_a_full_one_does_not(broker):
    go_idle(broker)
    idle = broker.queue("default").idle
    assert broker.client.zscore(idle, "w1") is not None
    tasks.record.enqueue("x")  # nobody listens on w1's channel: it stays pending
    assert broker.client.zscore(idle, "w1") is None
    claimed = broker.claim("default", worker_id="w1", limit=1, idle_for_ms=5000)
    assert len(claimed) == 1 and broker.client.zscore(idle, "w1") is None


def test_an_idle_listening_worker_is_handed_the_task(broker, listener):
    go_idle(broker)
    message = tasks.record.enqueue("handed")
    qk = broker.queue("default")
    assert broker.client.hget(qk.state, message.id) == TaskState.ACTIVE
    assert broker.client.hget(qk.owner, message.id) == "w1"
    assert broker.client.zcard(qk.pending) == 0
    received = wait_for(lambda: listener.get_message(timeout=0.1))
    task_id, run, body = received["data"].split("\n", 2)
    assert task_id == message.id and run == "1"
    assert TaskMessage.from_json(body, id=task_id, queue="default") == message
    assert broker.client.hget(qk.runs, message.id) == "1"  # its results are fenced like a claim's
    second = tasks.record.enqueue("queued")  # w1 is no longer idle: this one waits in pending
    assert broker.client.hget(qk.state, second.id) == TaskState.PENDING


def test_a_registered_worker_that_does_not_listen_gets_nothing(broker):
    go_idle(broker, "gone")
    message = tasks.record.enqueue("kept")
    qk = broker.queue("default")
    assert broker.client.hget(qk.state, message.id) == TaskState.PENDING
    assert broker.client.zcard(qk.idle) == 0


def test_a_worker_whose_idle_entry_expired_is_passed_over_and_dropped(broker, listener):
    qk = broker.queue("default")
    late = broker.client.pubsub(ignore_subscribe_messages=True)
    late.subscribe(qk.handoff_channel("late"))  # it still listens: only its entry's expiry stops it
    wait_for(lambda: broker.client.pubsub_numsub(qk.handoff_channel("late"))[0][1] == 1)
    try:
        now = broker.server_now_ms()
        broker.client.zadd(qk.idle, {"late": now - 1_000, "w1": now + 5_000})

        message = tasks.record.enqueue("handed")

        assert broker.client.hget(qk.owner, message.id) == "w1"
        assert broker.client.zrange(qk.idle, 0, -1) == []
    finally:
        late.close()


@pytest.mark.parametrize("blocker", ["paused", "pending", "scheduled"])
def test_no_hand_off_when_paused_behind_others_or_not_due(broker, listener, blocker):
    qk = broker.queue("default")
    if blocker == "pending":
        tasks.record.enqueue("ahead")
        broker.client.zadd(qk.idle, {"w1": broker.now_ms() + 5_000})  # as a short claim would
    else:
        go_idle(broker)
    if blocker == "paused":
        broker.pause("default")
    message = tasks.record.using(delay=60 if blocker == "scheduled" else None).enqueue("held")
    expected = TaskState.SCHEDULED if blocker == "scheduled" else TaskState.PENDING
    assert broker.client.hget(qk.state, message.id) == expected


def test_a_worker_leaves_the_idle_set_when_it_stops(broker, redis_client):
    worker = Worker(broker=broker, queues={"default": 1})
    worker.start()
    idle = broker.queue("default").idle
    wait_for(lambda: broker.client.zscore(idle, worker.id) is not None)
    message = tasks.record.using(retention=60).enqueue("idle-worker")
    wait_for(lambda: redis_client.lrange(tasks.report_key("idle-worker"), 0, -1))
    worker.stop()
    assert broker.client.zcard(idle) == 0
    assert broker.client.hget(broker.queue("default").state, message.id) == TaskState.COMPLETED


def test_a_task_handed_over_runs_on_the_fetching_thread_while_another_takes_over_fetching(
    broker, redis_client
):
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=2)
    processor = worker.processor
    worker.start()
    try:
        runners = []
        for name in ("first", "second"):
            wait_for(lambda: processor.fetcher.listening_idle, message="the worker to listen, idle")
            fetching = processor.fetcher.thread
            tasks.hold.enqueue(name)
            wait_for(lambda name=name: redis_client.lrange(tasks.report_key(f"{name}:started"), 0, -1))
            (job,) = [job for job in processor.jobs.running_jobs() if job.message.args == [name]]
            assert job.thread is fetching  # no second thread was woken to start it
            runners.append(job.thread)
        # Both run at once, each on the thread that was fetching when it came: fetching went on.
        assert runners[0] is not runners[1] and len(processor.jobs.running_jobs()) == 2
        assert processor.fetcher.thread not in (None, *runners)
        for name in ("first", "second"):
            redis_client.set(tasks.report_key(f"release:{name}"), "1")
        wait_for(lambda: not processor.jobs.running_jobs(), message="the tasks to finish")
    finally:
        worker.stop()
    assert processor.fetcher.stopped.is_set() and worker.dead_threads() == []
    assert broker.client.zcard(broker.queue("default").idle) == 0

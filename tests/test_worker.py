"""The worker, run in this process against a real Redis: every outcome of a task."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import redis

from django_rtq.broker import Broker, TaskMessage, TaskState, manual
from django_rtq.broker.waiting import waiting_for_worker
from django_rtq.exceptions import BrokerUnavailable, DuplicateTask
from django_rtq.worker import recoverer as recoverer_module
from django_rtq.worker.processor import Processor
from django_rtq.worker.processor.fetcher import MAX_SHORT_TASKS_BUFFER, SHORT_TASKS_BUFFER, held_tasks
from django_rtq.worker.server import Worker
from tests.support.clock import FakeClock
from tests.support.polling import wait_for
from tests.support.proxy import TCPProxy
from tests.support.runs import reports, task_state, wait_state
from tests.testapp import tasks


def test_a_task_runs_and_its_result_is_kept_for_its_retention(run_worker, inspector):
    message = tasks.add.enqueue(2, 3)
    with run_worker():
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
    assert done.result == 5
    assert done.score_at == pytest.approx(time.time() + 60, abs=5)
    assert done.info["worker"] and done.info["finished_at"] >= done.info["started_at"]
    assert inspector.queue_stats("default").processed_today == 1


def test_a_task_without_retention_is_deleted_when_done(run_worker, inspector, redis_client):
    message = tasks.record.enqueue("plain")
    with run_worker():
        wait_for(lambda: reports(redis_client, "plain"))
        wait_state(inspector, message.id, None)
    stats = inspector.queue_stats("default")
    assert stats.size == 0 and stats.processed_today == 1


def test_a_failing_task_is_retried_until_it_succeeds(run_worker, inspector, redis_client):
    message = tasks.flaky.using(retention=60).enqueue("flaky", 2)
    with run_worker():
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
    assert done.result == 3
    assert done.retried == 2
    stats = inspector.queue_stats("default")
    assert (stats.processed_today, stats.failed_today) == (3, 2)


def test_a_task_out_of_retries_is_archived_with_its_error(run_worker, inspector, redis_client):
    message = tasks.always_fails.enqueue("fails")
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert len(reports(redis_client, "fails")) == 3  # the first attempt and max_retries=2 retries
    assert archived.retried == 2
    assert archived.info["error_type"] == "builtins.ValueError"
    assert archived.last_error == "this task always fails"
    assert 'raise ValueError("this task always fails")' in archived.info["traceback"]


def test_retry_waits_for_the_backoff(run_worker, inspector, settings):
    settings.RTQ = {**settings.RTQ, "RETRY_BACKOFF": 3600}
    message = tasks.always_fails.enqueue("later")
    with run_worker():
        retrying = wait_state(inspector, message.id, TaskState.RETRY)
    assert retrying.score_at == pytest.approx(time.time() + 3600, abs=10)
    assert retrying.retried == 1


def test_a_non_retryable_error_archives_at_once(run_worker, inspector, redis_client):
    message = tasks.refuses.enqueue("refuses")
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert reports(redis_client, "refuses") == ["attempt"]
    assert archived.info["error_type"] == "django_rtq.exceptions.NonRetryableError"


def test_corrupt_payloads_are_archived_tasks_of_unknown_types_wait_and_the_worker_goes_on(
    run_worker, inspector, broker, redis_client
):
    unknown = TaskMessage(id="unknown-type", task="no.such.task", queue="default", max_retries=5)
    broker.enqueue([unknown])
    corrupt = tasks.record.using(task_id="corrupt").enqueue("never")
    redis_client.hset(broker.queue("default").msg, corrupt.id, "{not json")
    with run_worker():
        second = wait_state(inspector, "corrupt", TaskState.ARCHIVED)
        wait_for(lambda: waiting_for_worker(broker, "default"))
        tasks.record.enqueue("after")
        wait_for(lambda: reports(redis_client, "after"))
    assert "corrupt" in second.last_error
    assert reports(redis_client, "never") == []
    [waiting] = waiting_for_worker(broker, "default")
    assert (waiting.task, waiting.count) == ("no.such.task", 1)
    assert waiting.reason == "unknown task type 'no.such.task'"
    left = inspector.get_task("unknown-type")
    assert left.state == TaskState.PENDING and left.attempt.retried == 0 and not left.last_error


def test_a_task_past_its_timeout_fails_and_frees_its_slot(run_worker, inspector, redis_client):
    spinning = tasks.spin.enqueue("spin")
    stuck = tasks.stuck_in_c.enqueue("stuck")
    follower = tasks.record.enqueue("follower")
    with run_worker(concurrency=1):
        assert (
            wait_state(inspector, spinning.id, TaskState.ARCHIVED).info["error_type"].endswith("TaskTimeout")
        )
        assert wait_state(inspector, stuck.id, TaskState.ARCHIVED).info["error_type"].endswith("TaskTimeout")
        # The one thread was stuck in sleep() for 3 s, yet the next task runs well before.
        wait_for(lambda: reports(redis_client, "follower"), timeout=1.5)
        assert reports(redis_client, "stuck") == []
    assert follower.id


def test_a_deadline_in_the_past_archives_without_running(run_worker, inspector, redis_client):
    message = tasks.record.using(deadline=time.time() - 1, max_retries=3).enqueue("late")
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert archived.info["error_type"] == "django_rtq.exceptions.DeadlineExceeded"
    assert reports(redis_client, "late") == []


def test_a_deadline_stops_a_running_task(run_worker, inspector):
    message = tasks.block.using(deadline=timedelta(seconds=0.3), max_retries=3).enqueue("deadline")
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert archived.info["error_type"] == "django_rtq.exceptions.DeadlineExceeded"


def test_async_tasks_run_and_time_out(run_worker, inspector):
    added = tasks.async_add.using(retention=60).enqueue(20, 22)
    sleeping = tasks.async_sleep.enqueue("async")
    with run_worker():
        assert wait_state(inspector, added.id, TaskState.COMPLETED).result == 42
        timed_out = wait_state(inspector, sleeping.id, TaskState.ARCHIVED)
    assert timed_out.info["error_type"] == "django_rtq.exceptions.TaskTimeout"


def test_a_running_task_can_be_cancelled(run_worker, inspector, redis_client):
    message = tasks.block.using(max_retries=3).enqueue("cancel-me")
    with run_worker(concurrency=1) as worker:
        wait_for(worker.subscriber.subscribed.is_set)
        wait_for(lambda: reports(redis_client, "cancel-me:started"))
        assert manual.cancel(inspector.broker, "default", message.id, TaskState.ACTIVE) >= 1
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
        tasks.record.enqueue("after-cancel")
        wait_for(lambda: reports(redis_client, "after-cancel"))
    assert archived.info["error_type"] == "django_rtq.exceptions.TaskCancelled"


def test_a_scheduled_task_runs_once_due(run_worker, inspector, redis_client):
    message = tasks.record.using(delay=0.3).enqueue("scheduled")
    with run_worker():
        assert task_state(inspector, message.id) == TaskState.SCHEDULED
        wait_for(lambda: reports(redis_client, "scheduled"))
    assert task_state(inspector, message.id) is None


def test_higher_priority_runs_first_within_a_queue(run_worker, inspector, redis_client):
    inspector.broker.pause("default")
    for value, priority in [("low", -5), ("normal", 0), ("high", 50), ("normal2", 0)]:
        tasks.record.using(priority=priority).enqueue("order", value)
    with run_worker(concurrency=1):
        inspector.broker.resume("default")
        wait_for(lambda: len(reports(redis_client, "order")) == 4)
    assert reports(redis_client, "order") == ["high", "normal", "normal2", "low"]


def test_strict_priority_serves_heavier_queues_first(run_worker, redis_client):
    for i in range(3):
        tasks.record_low.enqueue("strict", f"low{i}")
        tasks.record_high.enqueue("strict", f"high{i}")
    with run_worker(queues={"high": 5, "low": 1}, strict=True, concurrency=1):
        wait_for(lambda: len(reports(redis_client, "strict")) == 6)
    assert reports(redis_client, "strict") == ["high0", "high1", "high2", "low0", "low1", "low2"]


def test_weighted_order_favours_heavier_queues(broker):
    processor = Processor(
        broker=broker,
        worker_id="w",
        queues={"a": 6, "b": 3, "c": 1},
        concurrency=1,
        syncer=None,
    )
    firsts = [processor.queue_order()[0] for _ in range(5000)]
    shares = {queue: firsts.count(queue) / len(firsts) for queue in "abc"}
    assert shares["a"] == pytest.approx(0.6, abs=0.05)
    assert shares["b"] == pytest.approx(0.3, abs=0.05)
    assert shares["c"] == pytest.approx(0.1, abs=0.05)
    assert sorted(processor.queue_order()) == ["a", "b", "c"]


def test_a_paused_queue_is_not_served_until_resumed(run_worker, inspector, redis_client):
    inspector.broker.pause("default")
    message = tasks.record.enqueue("paused")
    with run_worker() as worker:
        wait_for(lambda: worker.broker.workers())  # the worker is up and has looked at the queue
        time.sleep(0.2)  # not synchronisation: the time during which nothing must happen
        assert task_state(inspector, message.id) == TaskState.PENDING
        inspector.broker.resume("default")
        wait_for(lambda: reports(redis_client, "paused"))


def test_a_unique_task_can_be_enqueued_again_once_done(run_worker, inspector, redis_client):
    tasks.record.using(unique=60).enqueue("unique")
    with pytest.raises(DuplicateTask):
        tasks.record.using(unique=60).enqueue("unique")
    with run_worker():
        wait_for(lambda: reports(redis_client, "unique"))
        wait_for(lambda: inspector.queue_stats("default").size == 0)
    tasks.record.using(unique=60).enqueue("unique")


def test_burst_mode_returns_once_the_queues_are_drained(broker, inspector, redis_client):
    for i in range(20):
        tasks.record.enqueue("burst", i)
    later = tasks.record.using(delay=3600).enqueue("burst", "later")
    tasks.record.using(process_at=time.time() - 1).enqueue("burst", "due")
    Worker(broker=broker, queues={"default": 1}, burst=True).run()
    assert len(reports(redis_client, "burst")) == 21
    stats = inspector.queue_stats("default")
    assert (stats.pending, stats.active, stats.scheduled) == (0, 0, 1)
    assert task_state(inspector, later.id) == TaskState.SCHEDULED


def test_shutdown_returns_unfinished_tasks_to_pending(broker, inspector, redis_client):
    message = tasks.block.enqueue("shutdown")
    worker = Worker(broker=broker, queues={"default": 1}, shutdown_timeout=0.2)
    worker.start()
    wait_for(lambda: reports(redis_client, "shutdown:started"))
    worker.stop()
    back = inspector.get_task(message.id)
    assert back.state == TaskState.PENDING
    assert back.retried == 0 and back.owner is None
    assert inspector.queue_stats("default").failed_today == 0


def test_shutdown_lets_a_task_finish_within_the_timeout(broker, inspector, redis_client):
    message = tasks.block.using(retention=60).enqueue("finishes")
    worker = Worker(broker=broker, queues={"default": 1}, shutdown_timeout=5)
    worker.start()
    wait_for(lambda: reports(redis_client, "finishes:started"))
    redis_client.set(tasks.report_key("release:finishes"), "1")
    worker.stop()
    assert inspector.get_task(message.id).state == TaskState.COMPLETED


def test_the_heartbeater_registers_the_worker_and_extends_leases(run_worker, inspector, broker, redis_client):
    message = tasks.block.enqueue("lease")
    with run_worker(concurrency=3) as worker:
        wait_for(lambda: reports(redis_client, "lease:started"))
        first = inspector.get_task(message.id).score_at
        wait_for(lambda: inspector.get_task(message.id).score_at > first, message="lease extension")
        info = wait_for(lambda: [w for w in inspector.workers() if w["active"]])[0]
        assert info["id"] == worker.id and info["concurrency"] == 3 and info["queues"] == {"default": 1}
        assert [active["id"] for active in info["active"]] == [message.id]
        redis_client.set(tasks.report_key("release:lease"), "1")
    assert inspector.workers() == []


class FlakyBroker:
    """Wraps the broker so that settling fails `failures` times as if Redis were down."""

    def __init__(self, broker, failures):
        self._broker = broker
        self.failures = failures

    def complete(self, *args, **kwargs):
        if self.failures > 0:
            self.failures -= 1
            raise BrokerUnavailable("simulated outage")
        return self._broker.complete(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._broker, name)


def test_the_syncer_retries_a_completion_redis_did_not_take(broker, inspector):
    flaky = FlakyBroker(broker, failures=3)
    message = tasks.add.enqueue(1, 1)
    worker = Worker(broker=flaky, queues={"default": 1})
    worker.start()
    try:
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
    finally:
        worker.stop()
    assert flaky.failures == 0 and done.result == 2
    assert inspector.queue_stats("default").processed_today == 1


def expire_leases(broker, queue="default"):
    """Make every lease of a queue expire a minute ago, as if its worker had died then."""
    qk = broker.queue(queue)
    past = broker.server_now_ms() - 60_000
    broker.client.zadd(qk.active, dict.fromkeys(broker.client.zrange(qk.active, 0, -1), past))


def recoverer(broker, max_recoveries=5):
    from django_rtq.worker.recoverer import Recoverer

    return Recoverer(
        broker=broker,
        queues=["default"],
        interval=1,
        grace=0,
        max_recoveries=max_recoveries,
        settle_seconds=0,
    )


def test_a_dead_workers_started_task_goes_back_to_pending_without_an_attempt_charged(broker, inspector):
    message = tasks.add.enqueue(1, 1)
    broker.claim("default", worker_id="dead-worker", limit=10)
    expire_leases(broker)
    assert recoverer(broker).run_once() == 1
    back = inspector.get_task(message.id)
    assert back.state == TaskState.PENDING and back.retried == 0
    assert back.info["recovered"] == 1 and "requeued" not in back.info


def test_a_task_that_never_started_goes_back_uncounted(broker, inspector):
    message = tasks.add.enqueue(1, 1)
    broker.claim("default", worker_id="dead-worker", limit=10, start_now=0)  # prefetched only
    expire_leases(broker)
    recoverer(broker).run_once()
    back = inspector.get_task(message.id)
    assert back.state == TaskState.PENDING and back.retried == 0
    assert "recovered" not in back.info and back.info["requeued"] == 1


def test_a_reported_start_makes_a_prefetched_task_count_as_started(broker, inspector):
    message = tasks.add.enqueue(1, 1)
    [claimed] = broker.claim("default", worker_id="dead-worker", limit=10, start_now=0)
    broker.extend_leases("default", [(claimed.id, True)], worker_id="dead-worker")
    expire_leases(broker)
    recoverer(broker).run_once()
    assert inspector.get_task(message.id).info["recovered"] == 1


def test_a_task_that_keeps_killing_its_workers_is_archived_as_a_poison_pill(broker, inspector):
    message = tasks.add.enqueue(1, 1)
    for _ in range(3):
        broker.claim("default", worker_id="dead-worker", limit=10)
        expire_leases(broker)
        recoverer(broker, max_recoveries=2).run_once()
    archived = inspector.get_task(message.id)
    assert archived.state == TaskState.ARCHIVED
    assert archived.info["error_type"] == "django_rtq.exceptions.WorkerLost"
    assert "3 times" in archived.last_error and "dead-worker" in archived.last_error


def test_a_valid_lease_is_left_alone(broker, inspector):
    message = tasks.add.enqueue(1, 1)
    broker.claim("default", worker_id="live-worker", limit=10)
    assert recoverer(broker).run_once() == 0
    assert inspector.get_task(message.id).state == TaskState.ACTIVE


def test_corrupt_info_does_not_keep_a_task_from_being_recovered(broker, inspector):
    message = tasks.add.enqueue(1, 1)
    broker.claim("default", worker_id="dead-worker", limit=10)
    broker.client.hset(broker.queue("default").info, message.id, "{not json")
    expire_leases(broker)
    recoverer(broker).run_once()
    back = inspector.get_task(message.id)
    assert back.state == TaskState.PENDING and back.info["recovered"] == 1


def test_the_recoverer_waits_for_live_workers_to_renew_after_an_outage(
    broker, inspector, redis_url, prefix, monkeypatch
):
    clock = FakeClock()
    monkeypatch.setattr(recoverer_module, "time", SimpleNamespace(monotonic=clock))
    url = redis.connection.parse_url(redis_url)
    proxy = TCPProxy(url.get("host", "127.0.0.1"), url.get("port", 6379)).up()
    client = redis.Redis(port=proxy.port, db=url.get("db", 0), decode_responses=True, socket_timeout=2)
    patient = recoverer_module.Recoverer(
        broker=Broker(client, prefix=prefix), queues=["default"], interval=1, grace=0,
        max_recoveries=5, settle_seconds=30,
    )  # fmt: skip
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    try:
        broker.claim("default", worker_id="cut-off-worker", limit=1)
        expire_leases(broker)
        assert patient.run_once() == 0  # it has not been in touch with Redis for 30 s yet
        assert inspector.get_task(first.id).state == TaskState.ACTIVE
        clock.advance(30)
        assert patient.run_once() == 1
        assert inspector.get_task(first.id).state == TaskState.PENDING

        broker.claim("default", worker_id="cut-off-worker", limit=10)
        expire_leases(broker)
        proxy.down()  # this worker loses Redis: live workers may be unable to renew as well
        with pytest.raises(BrokerUnavailable):
            patient.run_once()
        proxy.up()
        clock.advance(30)  # an outage that lasted past the settle time: the wait starts again
        assert patient.run_once() == 0
        assert {inspector.get_task(m.id).state for m in (first, second)} == {TaskState.ACTIVE}
        clock.advance(29)
        assert patient.run_once() == 0
        clock.advance(1)
        assert patient.run_once() == 2
    finally:
        client.close()
        proxy.down()


@pytest.mark.django_db(transaction=True)
def test_django_connections_are_closed_around_each_task(run_worker, inspector, settings, tmp_path):
    settings.DATABASES["default"]["CONN_MAX_AGE"] = 0
    message = tasks.use_database.using(retention=60).enqueue()
    with run_worker(concurrency=1):
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
    assert done.result == 1
    wrapper = tasks.seen_connections[-1]
    wait_for(lambda: wrapper.connection is None, message="the task's connection to be closed")


def test_a_return_value_that_is_not_json_is_archived(run_worker, inspector):
    message = tasks.returns_set.enqueue()
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert "not JSON-serializable" in archived.last_error
    assert json.loads(archived.raw_message)["task"] == "tests.testapp.tasks.returns_set"


@pytest.mark.django_db(transaction=True)
def test_a_sync_task_runs_normally_on_a_thread_that_ran_an_async_one(run_worker, inspector):
    first = tasks.async_add.using(retention=60).enqueue(1, 2)
    second = tasks.use_database.using(retention=60, max_retries=0).enqueue()
    with run_worker(concurrency=1):
        assert wait_state(inspector, first.id, TaskState.COMPLETED).result == 3
        done = wait_state(inspector, second.id, TaskState.COMPLETED)
    assert done.result == 1 and done.retried == 0


def test_a_handler_can_read_its_own_task(run_worker, inspector):
    message = tasks.knows_itself.enqueue()
    async_message = tasks.knows_itself_async.enqueue()
    with run_worker():
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
        async_done = wait_state(inspector, async_message.id, TaskState.COMPLETED)
    assert done.result == {"id": message.id, "task": message.task, "queue": "default", "retried": 2}
    assert async_done.result == async_message.id
    from django_rtq import current_task

    assert current_task() is None


def test_a_worker_holds_more_tasks_while_they_are_short_and_fewer_once_they_are_long(broker, redis_client):

    worker = Worker(broker=broker, queues={"default": 1}, concurrency=2)
    worker.start()
    try:
        for i in range(50):
            tasks.record.enqueue("short", i)
        wait_for(lambda: len(reports(redis_client, "short")) == 50, message="the short tasks")
        # at least: more if the claims' round trips took longer than the tasks (held_tasks)
        assert worker.processor.capacity >= SHORT_TASKS_BUFFER * 2

        tasks.block.enqueue("long", 0.3)  # gives up after 0.3 s: longer than a short task
        wait_for(lambda: reports(redis_client, "long") == ["gave up"], message="the long task")
        wait_for(lambda: worker.processor.capacity == 2 * 2, message="the buffer to shrink")
    finally:
        worker.stop()


def test_held_tasks_grow_with_a_claims_round_trip_while_tasks_are_short():
    """A worker holds 2x its concurrency of long tasks, 4x of short ones, and for short ones
    also what its threads run while a claim is on its way, up to 16x."""
    assert held_tasks(8, run_seconds=0.2, claim_seconds=0.0005) == 2 * 8
    assert held_tasks(8, run_seconds=0.001, claim_seconds=0.0002) == SHORT_TASKS_BUFFER * 8
    assert held_tasks(8, run_seconds=0.001, claim_seconds=0.0025) == 2 * 8 + 20
    assert held_tasks(8, run_seconds=0.0001, claim_seconds=0.0025) == MAX_SHORT_TASKS_BUFFER * 8
    assert held_tasks(8, run_seconds=0.0, claim_seconds=0.0025) == SHORT_TASKS_BUFFER * 8  # nothing ran yet


def test_a_worker_whose_redis_is_a_slow_round_trip_away_holds_more_short_tasks(
    redis_url, prefix, redis_client
):
    """Redis behind a proxy that delays every exchange by 20 ms each way: a claim's round trip
    takes far longer than a short task, so the worker holds as many as it may, and claims them
    in batches of that size rather than four times its concurrency."""
    url = redis.connection.parse_url(redis_url)
    proxy = TCPProxy(url.get("host", "127.0.0.1"), url.get("port", 6379), delay=0.02).up()
    client = redis.Redis(port=proxy.port, db=url.get("db", 0), decode_responses=True, socket_timeout=5)
    worker = Worker(broker=Broker(client, prefix=prefix), queues={"default": 1}, concurrency=2, relay=False)
    for i in range(300):
        tasks.record.enqueue("far", i)
    claims, capacities = [], []
    claim = worker.processor.fetcher._claim

    def counted_claim(free, start_now):
        capacities.append(worker.processor.capacity)
        claimed = claim(free, start_now)
        claims.append(len(claimed))
        return claimed

    worker.processor.fetcher._claim = counted_claim
    worker.start()
    try:
        wait_for(lambda: len(reports(redis_client, "far")) == 300, timeout=60, message="the tasks")
        # The peak, not the last figure: handlers slowed near the end by a busy host (CI) raise
        # the moving average of durations, and so lower the capacity, as they should.
        assert max(capacities) == MAX_SHORT_TASKS_BUFFER * 2
        assert max(claims) > SHORT_TASKS_BUFFER * 2  # a claim took more than the loopback buffer
    finally:
        worker.stop()
        proxy.down()

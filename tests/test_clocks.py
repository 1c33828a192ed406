"""Hosts whose clocks disagree with Redis's: real `rtq_worker` processes (and an enqueuing
process) started with libfaketime 10 minutes ahead or behind, against a Redis on the true
time. Every time decision of the queue is taken on the Redis server's clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import redis

from django_rtq import Operations
from django_rtq.broker import TaskState
from django_rtq.broker.clock import ServerClock
from tests.support import ROOT
from tests.support.faketime import clock_off_by
from tests.support.polling import wait_for
from tests.support.servers import free_port
from tests.testapp import tasks

#: How far (seconds) the wrong clocks are off.
SKEW = 600
#: How close (seconds) to the Redis server's clock a time decided on a wrong host must be.
CLOSE = 5.0


@pytest.fixture
def ops(broker):
    return Operations()


def reported(redis_client, name):
    return redis_client.lrange(tasks.report_key(name), 0, -1)


def server_time(redis_client) -> float:
    seconds, microseconds = redis_client.time()
    return seconds + microseconds / 1e6


def state_of(ops, task_id) -> TaskState:
    return ops.live_task(task_id).state


def assert_host_clock_off(redis_client, name: str, skew: int) -> None:
    """The worker's wall clock (which report_host_clock reported as `name`) is `skew` off Redis's:
    the fault landed."""
    [host_clock] = reported(redis_client, name)
    assert float(host_clock) - server_time(redis_client) == pytest.approx(skew, abs=30)


def test_a_worker_ten_minutes_ahead_does_not_run_a_task_delayed_two_minutes(start_worker, ops, redis_client):
    start_worker(**clock_off_by(+SKEW))
    later = tasks.record.using(delay=120).enqueue("later")
    tasks.report_host_clock.using(delay=1).enqueue("probe")

    # The probe's score in the same scheduled set is below the delayed task's: the forwarder pass
    # that moved it read a clock at or past it, and would have moved the delayed task with it had
    # that clock read 2 minutes on.
    wait_for(lambda: reported(redis_client, "probe"), timeout=30, message="the probe to run")
    assert_host_clock_off(redis_client, "probe", +SKEW)
    assert redis_client.zscore(ops.broker.queue("default").scheduled, later.id) is not None
    assert reported(redis_client, "later") == []


def test_a_worker_ten_minutes_ahead_runs_a_task_whose_deadline_is_five_minutes_away(
    start_worker, ops, redis_client
):
    start_worker(**clock_off_by(+SKEW))
    tasks.report_host_clock.enqueue("probe")
    # It runs for a second: long enough for the watchdog to stop it were its time left reckoned
    # on the worker's clock.
    message = tasks.waits.using(deadline=timedelta(minutes=5)).enqueue("deadline", 1.0)

    done = wait_for(
        lambda: (
            state_of(ops, message.id) in (TaskState.COMPLETED, TaskState.ARCHIVED)
            and ops.live_task(message.id)
        ),
        timeout=30,
        message="the task to finish",
    )
    assert_host_clock_off(redis_client, "probe", +SKEW)
    assert done.state == TaskState.COMPLETED, (done.info.get("error_type"), done.info.get("error"))
    assert done.result == "waited"  # nobody stopped it


def test_a_worker_ten_minutes_behind_runs_a_task_delayed_one_second_on_time(start_worker, redis_client):
    worker = start_worker(**clock_off_by(-SKEW))
    tasks.report_host_clock.enqueue("probe")
    wait_for(lambda: reported(redis_client, "probe"), timeout=30, message="the worker to start")
    assert_host_clock_off(redis_client, "probe", -SKEW)

    enqueued = server_time(redis_client)
    tasks.report_host_clock.using(delay=1).enqueue("delayed")
    wait_for(lambda: reported(redis_client, "delayed"), timeout=1 + CLOSE, message="the delayed task")
    ran = float(reported(redis_client, "delayed")[0]) + SKEW  # its run, on the true clock
    print(f"\nclocks: a 1 s delay on a worker {SKEW} s behind ran {ran - enqueued - 1:.2f} s late")
    assert worker.poll() is None


def test_a_retry_backoff_holds_across_workers_whose_clocks_disagree(start_worker, ops, redis_client):
    """A worker 10 minutes ahead fails a task (its retry due 2 s later); one 10 minutes behind
    takes over and runs the retry on time."""
    ahead = start_worker(**clock_off_by(+SKEW))
    message = tasks.fails_once.enqueue("backoff")
    retry_key = ops.broker.queue("default").retry
    score = wait_for(lambda: redis_client.zscore(retry_key, message.id), timeout=30, message="the failure")
    failed_at = server_time(redis_client)
    ahead.send_signal(signal.SIGKILL)  # at once, before the retry is due: nothing of it is active
    ahead.wait()
    retry_at = score / 1000
    assert failed_at < retry_at < failed_at + 2 + CLOSE  # the backoff, on Redis's clock

    behind = start_worker(**clock_off_by(-SKEW))
    wait_for(lambda: any(w["pid"] == behind.pid for w in ops.workers()), timeout=30, message="the worker")
    ready_at = server_time(redis_client)
    wait_for(lambda: reported(redis_client, "backoff"), timeout=30, message="the retry")
    assert_host_clock_off(redis_client, "backoff", -SKEW)  # the worker behind ran it
    ran = float(reported(redis_client, "backoff")[0]) + SKEW
    print(
        f"\nclocks: a retry due 2 s after a failure on a worker {SKEW} s ahead ran "
        f"{ran - max(retry_at, ready_at):.2f} s late on a worker {SKEW} s behind"
    )
    assert ran < max(retry_at, ready_at) + CLOSE
    done = wait_for(lambda: (task := ops.live_task(message.id)).state == TaskState.COMPLETED and task)
    assert done.retried == 1


def test_a_rate_limit_holds_on_workers_whose_clocks_disagree(start_worker, broker, redis_client):
    """Two workers, 10 minutes ahead and 10 minutes behind, share a bucket of 10 starts a second.
    (claim.lua has always reckoned buckets on the server's TIME: this guards that it stays so.)"""
    start_worker(**clock_off_by(+SKEW))
    start_worker(**clock_off_by(-SKEW))
    count = 40
    broker.enqueue([tasks.rate_10_on_server_clock.prepare("rate") for _ in range(count)])

    wait_for(lambda: len(reported(redis_client, "rate")) == count, timeout=60, message="every start")
    starts = sorted(float(at) for at in reported(redis_client, "rate"))
    most_in_a_second = max(sum(1 for other in starts if start <= other < start + 1.0) for start in starts)
    # The rate, plus the burst (1), plus 2 for starts whose report came late into the next
    # second on a loaded machine; a bucket refilled for 10 minutes by a clock ahead would let
    # all 40 start at once.
    assert most_in_a_second <= 10 + 1 + 2
    # Nor did a clock behind (a bucket stamped 10 minutes on, never refilling) stall them: 40
    # starts take about 4 s.
    assert starts[-1] - starts[0] < (count - 1) / 10 + 30


ENQUEUE = textwrap.dedent(
    """
    import django
    django.setup()
    from datetime import timedelta
    from tests.testapp import tasks
    later = tasks.record.using(delay=120).enqueue("later")
    soon = tasks.record.using(deadline=timedelta(minutes=5)).enqueue("soon")
    from django_rtq.workflows import group
    flow = group(tasks.record.s("flow")).using(delay=120).enqueue()
    print(later.id, soon.id, flow)
    """
)


@pytest.mark.parametrize("skew", [+SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_web_host_off_by_ten_minutes_reckons_a_delay_and_a_deadline_from_redis_time(
    ops, redis_client, prefix, skew
):
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "RTQ_TEST_PREFIX": prefix,
        **clock_off_by(skew),
    }
    before = server_time(redis_client)
    done = subprocess.run(
        [sys.executable, "-c", ENQUEUE], env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    after = server_time(redis_client)
    assert done.returncode == 0, done.stderr
    later_id, soon_id, flow_id = done.stdout.split()

    later = ops.live_task(later_id)
    assert later.state == TaskState.SCHEDULED
    assert before + 120 - CLOSE < later.message.process_at < after + 120 + CLOSE
    soon = ops.live_task(soon_id).message
    assert before + 300 - CLOSE < soon.deadline < after + 300 + CLOSE
    assert before - CLOSE < soon.enqueued_at < after + CLOSE
    flow = ops.live_task(flow_id)  # a postponed workflow's delay, from its creation
    assert flow.workflow["stage"] == "postponed"
    assert before + 120 - CLOSE < flow.message.process_at < after + 120 + CLOSE


def test_periodic_ticks_are_reckoned_on_redis_time_by_workers_whose_clocks_disagree(
    start_worker, redis_client
):
    """A schedule every second, on two workers 10 minutes ahead and behind: each tick once, none
    before its time by Redis's clock, none 10 minutes late."""
    start_worker(RTQ_TEST_PERIODIC_EVERY="1", **clock_off_by(+SKEW))
    start_worker(RTQ_TEST_PERIODIC_EVERY="1", **clock_off_by(-SKEW))
    wait_for(lambda: len(reported(redis_client, "every_tick")) >= 4, timeout=30, message="4 ticks")
    now = server_time(redis_client)
    ticks = [int(task_id.rsplit(":", 1)[1]) / 1000 for task_id in reported(redis_client, "every_tick")]
    assert len(set(ticks)) == len(ticks)
    assert all(now - 30 < tick <= now for tick in ticks), [tick - now for tick in ticks]


def test_a_process_that_cannot_reach_redis_reads_its_own_clock_without_an_error():
    """The enqueue side builds a message before it sends it (into the outbox when Redis is
    away): with no TIME reply yet, the clock is this host's, and reading it raises nothing."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=None, decode_responses=True)
    clock = ServerClock(client)
    before = time.time()
    assert before <= clock() <= time.time()
    assert clock.offset is None
    started = time.monotonic()
    clock()  # asks again only after RETRY_SECONDS: no second wait on the connection
    assert time.monotonic() - started < 0.1


@pytest.mark.parametrize("skew", [+SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_finished_task_is_kept_for_its_retention_by_redis_time(start_worker, ops, redis_client, skew):
    """A result kept 60 s is kept 60 s by Redis's clock: not 11 minutes (a worker ahead), nor
    deleted at once (a worker behind, whose janitor took it for 9 minutes old)."""
    start_worker(**clock_off_by(skew))
    message = tasks.add.enqueue(1, 2)  # retention=60
    completed = ops.broker.queue("default").completed
    score = wait_for(lambda: redis_client.zscore(completed, message.id), timeout=30, message="the result")
    kept_until = score / 1000
    assert server_time(redis_client) + 60 - CLOSE < kept_until < server_time(redis_client) + 60
    tasks.report_host_clock.enqueue("probe")  # after it: the janitor had passes meanwhile too
    wait_for(lambda: reported(redis_client, "probe"), timeout=30, message="the probe")
    assert_host_clock_off(redis_client, "probe", skew)
    assert ops.live_task(message.id).result == 3

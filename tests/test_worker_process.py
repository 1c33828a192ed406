"""`manage.py rtq_worker` as real processes: SIGKILL, SIGTERM, --burst and --processes."""

from __future__ import annotations

import os
import signal

import pytest

from django_rtq import Operations
from django_rtq.broker import TaskState
from django_rtq.worker.server import EXIT_GRACE_SECONDS
from tests.support.polling import wait_for
from tests.testapp import tasks


@pytest.fixture
def ops(broker):
    return Operations()


def reported(redis_client, name):
    return redis_client.lrange(tasks.report_key(name), 0, -1)


def test_a_task_of_a_sigkilled_worker_is_recovered_and_completed(start_worker, ops, redis_client):
    message = tasks.block.using(max_retries=2, retention=60).enqueue("killed")
    first = start_worker(lease=1)
    wait_for(lambda: reported(redis_client, "killed:started"), timeout=20)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert ops.live_task(message.id).state == TaskState.ACTIVE  # nobody settled it

    redis_client.set(tasks.report_key("release:killed"), "1")
    start_worker(lease=1)
    done = wait_for(
        lambda: (task := ops.live_task(message.id)).state == TaskState.COMPLETED and task,
        timeout=20,
    )
    assert done.retried == 0  # a crash is not the task's failure: no attempt charged
    assert done.info["recovered"] == 1
    assert done.result == "released"
    assert reported(redis_client, "killed") == ["done"]


def test_sigterm_returns_the_running_task_to_pending(start_worker, ops, redis_client):
    message = tasks.block.enqueue("terminated")
    worker = start_worker("--shutdown-timeout", "0.3")
    wait_for(lambda: reported(redis_client, "terminated:started"), timeout=20)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    back = ops.live_task(message.id)
    assert back.state == TaskState.PENDING and back.retried == 0 and back.owner is None
    assert ops.workers() == []


def test_sigterm_exits_whatever_threads_a_handler_left_running(start_worker, redis_client):
    tasks.leaves_a_pool_job.enqueue("pooled")
    worker = start_worker("--shutdown-timeout", "0.3")
    wait_for(lambda: reported(redis_client, "pooled:started"), timeout=20)
    worker.send_signal(signal.SIGTERM)

    assert worker.wait(timeout=0.3 + EXIT_GRACE_SECONDS + 10) == 0
    assert "pool-of-pooled" in worker.stdout.read()  # the log line names the thread left
    assert reported(redis_client, "pooled") == []  # its job still ran: nobody waited for it


def test_sigterm_stops_supervised_workers_whatever_threads_a_handler_left_running(
    start_worker, ops, redis_client
):
    supervisor = start_worker("--processes", "2", "--shutdown-timeout", "0.3")
    wait_for(lambda: len(ops.workers()) == 2, timeout=20)
    tasks.leaves_a_pool_job.enqueue("pooled")
    wait_for(lambda: reported(redis_client, "pooled:started"), timeout=20)
    supervisor.send_signal(signal.SIGTERM)

    assert supervisor.wait(timeout=30) == 0
    output = supervisor.stdout.read()
    assert "pool-of-pooled" in output
    assert "did not stop in time" not in output  # the worker process exited; nobody killed it


def test_burst_drains_the_queues_and_exits_zero(start_worker, ops, redis_client):
    for i in range(30):
        tasks.record.enqueue("burst", i)
    worker = start_worker("--burst", "--concurrency", "4")
    assert worker.wait(timeout=30) == 0, worker.stdout.read()
    assert sorted(map(int, reported(redis_client, "burst"))) == list(range(30))
    assert ops.queue_stats("default").size == 0


def test_processes_are_supervised_and_restarted(start_worker, ops, redis_client):
    supervisor = start_worker("--processes", "2", "--concurrency", "2")
    workers = wait_for(lambda: len(ops.workers()) == 2 and ops.workers(), timeout=20)
    victim = workers[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: (pids := {w["pid"] for w in ops.workers()}) and len(pids) == 2 and victim not in pids,
        timeout=20,
        message="a replacement worker process",
    )
    for i in range(10):
        tasks.record.enqueue("supervised", i)
    wait_for(lambda: len(reported(redis_client, "supervised")) == 10, timeout=20)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    wait_for(lambda: ops.workers() == [], timeout=10)


def test_bad_queue_option_is_a_command_error(start_worker):
    worker = start_worker("--queues", "a:0")
    assert worker.wait(timeout=20) != 0
    assert "weight of at least 1" in worker.stdout.read()


def test_worker_processes_stop_when_their_supervisor_is_killed(start_worker, ops):
    supervisor = start_worker("--processes", "2")
    pids = {w["pid"] for w in wait_for(lambda: len(ops.workers()) == 2 and ops.workers(), timeout=20)}
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(lambda: all(gone(pid) for pid in pids), timeout=20, message="orphaned workers to stop")

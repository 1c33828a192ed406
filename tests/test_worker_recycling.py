"""Recycling real worker processes: `rtq_worker --max-tasks-per-child` and `--max-memory-per-child`."""

from __future__ import annotations

import signal
from collections import Counter

from django_rtq.worker.server import EXIT_RECYCLED
from tests.support.polling import wait_for
from tests.testapp import tasks


def reported(redis_client, name: str) -> list[str]:
    return redis_client.lrange(tasks.report_key(name), 0, -1)


def test_children_are_replaced_after_their_tasks_and_every_task_runs_once_whole(start_worker, redis_client):
    for i in range(200):  # all waiting before the workers start: none is handed to one at enqueue
        tasks.record_pid.enqueue("recycled", i)
    supervisor = start_worker("--processes", "2", "--concurrency", "2", "--max-tasks-per-child", "10")
    wait_for(lambda: len(reported(redis_client, "recycled")) >= 200, timeout=60, message="200 runs")

    runs = [line.split(":") for line in reported(redis_client, "recycled")]
    values = Counter(int(value) for value, _ in runs)
    assert sorted(values) == list(range(200)) and set(values.values()) == {1}  # each ran once
    started = Counter(map(int, reported(redis_client, "recycled:started")))
    assert started == values  # no run was cut: each one started also finished, and only once
    per_child = Counter(pid for _, pid in runs)
    assert len(per_child) >= 200 // 10, per_child  # replaced after 10 tasks...
    assert max(per_child.values()) <= 10, per_child  # ...and none ran more
    assert supervisor.poll() is None  # the supervisor stayed up through all the replacements

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    assert "exited with code" not in supervisor.stdout.read()  # no child died: each was recycled


def test_a_child_over_its_memory_limit_is_replaced(start_worker, redis_client):
    for _ in range(8):
        tasks.keeps_memory.enqueue("leaky", 40)  # each run keeps 40 MB for good, as a leak does
    supervisor = start_worker("--max-memory-per-child", "150", "--concurrency", "1", "--loglevel", "INFO")
    wait_for(lambda: len(reported(redis_client, "leaky")) == 8, timeout=60, message="8 runs")

    rss_by_pid: dict[str, list[float]] = {}
    for line in reported(redis_client, "leaky"):
        pid, rss = line.split(":")
        rss_by_pid.setdefault(pid, []).append(float(rss))
    assert len(rss_by_pid) >= 2, rss_by_pid  # replaced at least once
    *replaced, _ = rss_by_pid.values()  # the last child may still be under its limit
    for sizes in replaced:
        # A child ran tasks while under 150 MB, and was replaced after the one that crossed it.
        assert sizes[-1] > 150 and all(size <= 150 for size in sizes[:-1]), rss_by_pid

    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    output = supervisor.stdout.read()
    assert "over 150 MB (--max-memory-per-child)" in output
    assert f"exited with code {EXIT_RECYCLED}" not in output


def test_recycling_limits_must_be_positive(start_worker):
    worker = start_worker("--max-tasks-per-child", "0")
    assert worker.wait(timeout=20) != 0
    assert "--max-tasks-per-child must be more than 0." in worker.stdout.read()

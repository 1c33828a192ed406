"""Flow control with real `rtq_worker` processes: rate and concurrency limits hold across
workers, a SIGKILLed worker leaks no slot, queue and type limits together, limits changed by a
deploy, Django's own `@task`, and the 3-master cluster. Handlers record each run's start and end
(tests/testapp/tasks.py: run_recorded), and the tests check the limits on those records."""

from __future__ import annotations

import json
import signal
import time

import pytest

from bench.counting import most_at_once, most_starts_within
from django_rtq import Operations, enqueue_many
from django_rtq.broker import Broker
from django_rtq.broker.inspect import Inspector
from django_rtq.broker.limits import HELD_BASE
from django_rtq.flow_control import project_limits
from tests.support.polling import wait_for
from tests.support.recorded_runs import ended, runs_of, start_workers, stop_workers
from tests.testapp import dtasks, tasks

#: The tests' queues: each test has a key prefix of its own, so no other test's tasks are in them.
QUEUE = "default"
#: The queue a test gives a limit of its own (RTQ_TEST_QUEUE_LIMITS): one the settings name.
CAPPED_QUEUE = "low"
#: The windows, in seconds, in which the tests count starts: a second, and a few seconds.
WINDOWS = (1.0, 2.0, 5.0, 10.0)


def assert_rate_held(starts: list[float], per_second: int, *, burst: int = 1, reached: bool = True) -> None:
    """Count the runs' recorded starts in windows of each length: none holds more than the rate
    allows (plus the burst, and one start the bucket may let in up to 2 ms early for a late claim
    when several seconds are counted); with `reached`, some second holds the full rate. Only
    the starts' spacing counts: how long the whole took depends on the machine's load."""
    print("starts per second:", starts_per_second(starts))
    for seconds in WINDOWS:
        slack = 0 if seconds == 1.0 else 1
        assert most_starts_within(starts, seconds) <= per_second * seconds + burst + slack, seconds
    if reached:
        assert most_starts_within(starts, 1.0) >= per_second


def starts_per_second(starts: list[float]) -> list[int]:
    """How many of the starts fell in each second from the first (for the test's output)."""
    counts = [0] * (int(max(starts) - min(starts)) + 1)
    for at in starts:
        counts[int(at - min(starts))] += 1
    return counts


def flow_use(client, broker: Broker, queue: str) -> tuple[dict, int, int]:
    """A queue's concurrency use (`running`), tasks with a slot (`slots`), and tasks held."""
    keys = broker.queue(queue)
    return client.hgetall(keys.running), client.hlen(keys.slots), client.zcard(keys.held)


def test_a_rate_of_10_per_second_holds_across_three_worker_processes(start_worker, broker, redis_client):
    start_workers(start_worker, 3, "--queues", QUEUE, "--concurrency", "8")
    enqueue_many([tasks.flow_rate_10.prepare("rate") for _ in range(200)])
    runs = wait_for(lambda: ended(redis_client, "rate", 200), timeout=45, message="200 rate-limited runs")

    assert len(runs) == 200  # each ran once
    assert_rate_held([run.start for run in runs], per_second=10)
    assert len({run.pid for run in runs}) == 3  # every worker took its share
    assert flow_use(redis_client, broker, QUEUE) == ({}, 0, 0)


def test_two_at_once_across_three_workers_and_a_sigkilled_worker_leaks_no_slot(
    start_worker, broker, redis_client
):
    workers = start_workers(start_worker, 3, "--queues", QUEUE, "--concurrency", "4", lease=1)
    blocker = tasks.flow_two_at_once.using(retention=60).prepare("two", until_released=True)
    enqueue_many([blocker, *(tasks.flow_two_at_once.prepare("two") for _ in range(39))])

    [first] = wait_for(lambda: [r for r in runs_of(redis_client, "two") if r.id == blocker.id], timeout=20)
    [victim] = [worker for worker in workers if worker.pid == first.pid]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.time()
    redis_client.set(tasks.report_key("release:two"), "1")  # its run after recovery ends at once

    runs = wait_for(lambda: ended(redis_client, "two", 40), timeout=60, message="40 runs to end")
    cut_short = [run for run in runs if run.end is None]
    assert blocker.id in {run.id for run in cut_short}
    assert {run.pid for run in cut_short} == {victim.pid}  # only the killed worker's runs never ended
    intervals = [(run.start, run.end if run.end is not None else killed_at) for run in runs]
    assert most_at_once(intervals) == 2  # never more than its limit, and the limit reached
    info = Operations().live_task(blocker.id).info
    assert info["recovered"] == 1  # its slot came back with the recoverer, and it ran again
    assert len(runs) == 40 + len(cut_short)
    wait_for(lambda: flow_use(redis_client, broker, QUEUE) == ({}, 0, 0), timeout=10)


def test_a_queue_limit_and_a_type_limit_together(start_worker, broker, redis_client, settings):
    queue_limits = {CAPPED_QUEUE: {"max_concurrency": 3}}
    settings.RTQ = {**settings.RTQ, "QUEUE_LIMITS": queue_limits}  # the enqueuer's, as the workers'
    start_workers(
        start_worker, 3, "--queues", CAPPED_QUEUE, "--concurrency", "4",
        RTQ_TEST_QUEUE_LIMITS=json.dumps(queue_limits),
    )  # fmt: skip
    single, unlimited = (
        tasks.flow_one_at_once.using(queue=CAPPED_QUEUE),
        tasks.flow_unlimited.using(queue=CAPPED_QUEUE),
    )
    messages = []
    for _ in range(10):
        messages += [single.prepare("capped"), unlimited.prepare("capped"), unlimited.prepare("capped")]
    enqueue_many(messages)

    runs = wait_for(lambda: ended(redis_client, "capped", 30), timeout=30, message="30 runs to end")
    assert len(runs) == 30
    assert most_at_once([(run.start, run.end) for run in runs]) == 3  # the queue's limit, reached
    singles = [(run.start, run.end) for run in runs if run.task == tasks.flow_one_at_once.name]
    assert len(singles) == 10 and most_at_once(singles) == 1
    # a run reports its end before its worker settles it and gives its slot back
    wait_for(lambda: flow_use(redis_client, broker, CAPPED_QUEUE) == ({}, 0, 0), timeout=10)


def test_limits_changed_by_a_deploy_apply_from_its_first_claim(start_worker, broker, redis_client):
    args = ("--queues", QUEUE, "--concurrency", "4")
    old = start_workers(start_worker, 3, *args, RTQ_TEST_FLOW_DEPLOY_CONCURRENCY="1")
    enqueue_many([tasks.flow_per_deploy.prepare("deploy") for _ in range(30)])
    pending = broker.queue(QUEUE).pending
    wait_for(lambda: ended(redis_client, "deploy", 4), timeout=20, message="a few runs of the old deploy")
    stop_workers(old)
    held = set(redis_client.zrangebyscore(pending, HELD_BASE, "+inf"))
    assert held  # the old deploy's limit held tasks back

    new = start_workers(start_worker, 3, *args, RTQ_TEST_FLOW_DEPLOY_CONCURRENCY="3")
    runs = wait_for(lambda: ended(redis_client, "deploy", 30), timeout=30, message="30 runs to end")
    old_pids = {worker.pid for worker in old}
    before = [(run.start, run.end) for run in runs if run.pid in old_pids]
    after = [(run.start, run.end) for run in runs if run.pid in {worker.pid for worker in new}]
    assert len(before) + len(after) == 30
    assert most_at_once(before) == 1
    assert most_at_once(after) == 3  # the new limit applies
    assert held <= {run.id for run in runs if run.pid not in old_pids}  # the held ones all ran
    # The last runs' ends are recorded by their handlers a moment before their slots are freed.
    wait_for(lambda: flow_use(redis_client, broker, QUEUE) == ({}, 0, 0), timeout=10, message="free slots")


def test_djangos_own_task_is_limited_across_workers(start_worker, broker, redis_client):
    start_workers(start_worker, 2, "--concurrency", "4")
    results = [dtasks.flow_django_limited.enqueue("django") for _ in range(20)]
    runs = wait_for(lambda: ended(redis_client, "django", 20), timeout=30, message="20 runs to end")
    assert {run.id for run in runs} == {result.id for result in results}
    assert most_at_once([(run.start, run.end) for run in runs]) == 2  # max_concurrency=2
    assert_rate_held([run.start for run in runs], per_second=10, reached=False)  # rate_limit="10/s"


@pytest.fixture
def cluster_prefix(redis_cluster, cluster_broker, prefix, redis_client, monkeypatch):
    """The cluster broker's key prefix, which the handlers' reports go under (on the standalone
    Redis), instead of the standalone one (`prefix`, set up first)."""
    name = cluster_broker.keys.prefix
    monkeypatch.setenv("RTQ_TEST_PREFIX", name)
    yield name
    keys = list(redis_client.scan_iter(f"rtqtest-report:{name}:*"))
    if keys:
        redis_client.delete(*keys)


def test_a_rate_limit_holds_on_the_cluster(
    redis_cluster, cluster_broker, cluster_prefix, start_worker, redis_client, redis_url
):
    cluster_broker.limits = project_limits  # the enqueuer applies the project's limits, as a project's does
    start_workers(
        start_worker, 3, "--queues", QUEUE, "--concurrency", "8",
        registered=Inspector(cluster_broker).workers,
        RTQ_REDIS_URL=f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}/0",
        RTQ_TEST_PREFIX=cluster_prefix,
        RTQ_TEST_REPORT_URL=redis_url,
    )  # fmt: skip
    cluster_broker.enqueue([tasks.flow_rate_10.prepare("rate") for _ in range(60)])
    runs = wait_for(lambda: ended(redis_client, "rate", 60), timeout=30, message="60 runs on the cluster")

    assert len(runs) == 60
    # A start is timed by its handler, after its claim took the token: a worker's first task on
    # a cluster client (its slots learned first) can start over a token's interval (0.1 s) late,
    # in a second that also holds the next second's tokens: one start more at most.
    assert_rate_held([run.start for run in runs], per_second=10, burst=2)
    assert flow_use(cluster_broker.client, cluster_broker, QUEUE) == ({}, 0, 0)

"""Issue 10, failover: nothing lost when the broker's master fails over under real workers.

Two worker processes (`rtq_worker`, django-rtq's defaults but lease 5 s, heartbeat 1 s,
recoverer 1 s) work through 1,000 tasks of ~10 ms on a replicated Redis whose master is
failed over a quarter of the way through:

- Sentinel: a master, a replica and three sentinels (quorum 2); the failover is asked of a
  sentinel (`SENTINEL FAILOVER`), or the master is SIGKILLed and the sentinels promote the
  replica.
- Cluster: three masters with a replica each; the master of the queue's slot is failed over
  (`CLUSTER FAILOVER` on its replica), or SIGKILLed and its replica takes over.

800 tasks are enqueued (and replicated) before the failover, 200 after it through a client
that has to find the new master. Each task records its run on the suite's shared Redis,
which does not fail over. The proof: every task ran to completion at least once, none was
archived, and nothing is left pending, active, scheduled or in retry.

Each test prints one line (`chaos <name>: tasks=... lost=... drain=...s`) and appends it to
the file `$RTQ_CHAOS_REPORT` when set.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from django_rtq.broker import Broker
from django_rtq.connection import redis_client as connect_url
from django_rtq.exceptions import BrokerUnavailable, TaskIdConflict
from tests.chaos.failover_servers import ReplicatedCluster, SentinelGroup, WorkerProcess
from tests.chaos.failover_settings import register_record_task
from tests.support.polling import wait_for
from tests.testapp.tasks import report_key

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(360)]

TASKS = 1000
#: Tasks enqueued before the failover; the rest are enqueued once the new master serves.
BEFORE = 800
WORKERS = 2
#: Seconds each task works before it records its run.
TASK_SECONDS = 0.01
#: The engine's defaults for these (issue 10): lease 5 s, heartbeat 1 s, recoverer 1 s.
ENGINE_DEFAULTS = {
    "RTQ_TEST_LEASE": "5",
    "RTQ_TEST_HEARTBEAT_INTERVAL": "1",
    "RTQ_TEST_RECOVERER_INTERVAL": "1",
}
#: Seconds the queue gets to drain once the failover is done. A task whose completion the old
#: master acknowledged but never replicated is active again on the new one: its lease (5 s)
#: must expire, then RECOVERY_GRACE (30 s by default), then a retry backoff (up to 5 s).
DRAIN_TIMEOUT = 150.0
QUEUE = "default"
#: The task states a drained queue has nothing in.
LIVE_STATES = ("pending", "active", "scheduled", "retry")


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    group = SentinelGroup().start()
    yield group
    group.close()


@pytest.fixture
def replicated_cluster() -> Iterator[ReplicatedCluster]:
    cluster = ReplicatedCluster().start()
    yield cluster
    cluster.close()


@pytest.fixture
def spawn_worker(prefix: str, tmp_path: Path) -> Iterator[Callable[[str, str], WorkerProcess]]:
    """Start worker processes on the test's prefix; all are stopped (then killed) at teardown."""
    started: list[WorkerProcess] = []

    def spawn(broker_url: str, name: str) -> WorkerProcess:
        worker = WorkerProcess(
            broker_url=broker_url, prefix=prefix, log_dir=tmp_path, env=ENGINE_DEFAULTS, name=name
        )
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        worker.stop(timeout=10)


def retrying(action: Callable[[], object], what: str, timeout: float = 30.0) -> object:
    """Run `action` until it does not fail for want of Redis (a failover in progress)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except (BrokerUnavailable, redis.RedisError) as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} kept failing for {timeout}s: {exc!r}") from exc
            time.sleep(0.1)


def enqueue_once(broker: Broker, messages: list) -> None:
    """Enqueue a chunk (all or nothing), tolerating a retry after a reply lost in a failover."""
    # TaskIdConflict: an earlier attempt wrote the chunk, and its reply was lost
    with contextlib.suppress(TaskIdConflict):
        broker.enqueue(messages)


def queue_counts(broker: Broker) -> dict[str, int] | None:
    """How many tasks of the queue are in each live state and archived; None if Redis does not answer."""
    keys = broker.queue(QUEUE)
    try:
        pipe = broker.client.pipeline(transaction=False)
        for state in (*LIVE_STATES, "archived"):
            pipe.zcard(getattr(keys, state))
        counts = pipe.execute()
    except (BrokerUnavailable, redis.RedisError):
        return None
    return dict(zip((*LIVE_STATES, "archived"), counts, strict=True))


def archived_reasons(broker: Broker, limit: int = 5) -> list[str]:
    keys = broker.queue(QUEUE)
    try:
        ids = broker.client.zrange(keys.archived, 0, limit - 1)
        infos = broker.client.hmget(keys.info, ids) if ids else []
    except redis.RedisError as exc:
        return [f"(could not read the archive: {exc!r})"]
    return [f"{task_id}: {info}" for task_id, info in zip(ids, infos, strict=True)]


def run_failover_scenario(
    label: str,
    *,
    broker_url: str,
    prefix: str,
    shared: redis.Redis,
    spawn_worker: Callable[[str, str], WorkerProcess],
    replicate: Callable[[], None],
    fail_over: Callable[[], float],
) -> None:
    """Run TASKS tasks through WORKERS worker processes, failing the master over with
    `fail_over` (which returns once the new master serves, with the seconds that took) a
    quarter of the way through; then check that nothing was lost and report."""
    task_type = register_record_task()
    report = report_key(label)
    messages = [task_type.prepare(label, i, TASK_SECONDS) for i in range(TASKS)]
    broker = Broker(connect_url(broker_url), prefix=prefix)
    workers = [spawn_worker(broker_url, f"worker-{i}") for i in range(WORKERS)]
    try:
        started = time.monotonic()
        enqueue_once(broker, messages[:BEFORE])
        replicate()  # a write the replica never got is lost by Redis itself, not by django-rtq
        quarter = BEFORE // 4
        _wait(
            lambda: shared.llen(report) >= quarter,
            60,
            f"{quarter} tasks to run before the failover",
            workers,
        )
        ran_before = shared.llen(report)
        failover_seconds = fail_over()
        retrying(lambda: enqueue_once(broker, messages[BEFORE:]), "enqueueing after the failover")
        failed_over_at = time.monotonic()

        def drained() -> bool:
            counts = queue_counts(broker)
            return (
                counts is not None
                and not any(counts[state] for state in LIVE_STATES)
                and len(set(shared.lrange(report, 0, -1))) >= TASKS
            )

        deadline = failed_over_at + DRAIN_TIMEOUT
        while not drained() and time.monotonic() < deadline and any(w.alive() for w in workers):
            time.sleep(0.2)
        drain_seconds = time.monotonic() - failed_over_at
        total_seconds = time.monotonic() - started

        runs = Counter(int(value) for value in shared.lrange(report, 0, -1))
        lost = sorted(set(range(TASKS)) - set(runs))
        reruns = sum(runs.values()) - len(runs)
        counts = queue_counts(broker) or {}
        left = {state: counts.get(state) for state in LIVE_STATES if counts.get(state) != 0}
        archived = counts.get("archived")
        dead = [w for w in workers if not w.alive()]
        summary = (
            f"chaos {label}: tasks={TASKS} lost={len(lost)} archived={archived} "
            f"left={sum(v or 0 for v in left.values()) if counts else '?'} reruns={reruns} "
            f"ran_before_failover={ran_before} failover={failover_seconds:.1f}s "
            f"drain={drain_seconds:.1f}s total={total_seconds:.1f}s workers_alive={WORKERS - len(dead)}"
        )
        print(summary)
        if os.environ.get("RTQ_CHAOS_REPORT"):
            with open(os.environ["RTQ_CHAOS_REPORT"], "a") as out:
                out.write(summary + "\n")

        problems = []
        if lost:
            problems.append(f"{len(lost)} task(s) never ran to completion, e.g. indices {lost[:10]}")
        if archived:
            problems.append(f"{archived} task(s) archived, e.g. {archived_reasons(broker)}")
        if left:
            problems.append(f"tasks still in the queue after {drain_seconds:.0f}s: {left}")
        if not counts:
            problems.append("the new master did not answer the final count")
        if dead:
            problems.append(
                "worker process(es) exited during the run: "
                + ", ".join(f"{w.name} (exit code {w.process.returncode})" for w in dead)
            )
        if problems:
            logs = "\n".join(w.log_tail() for w in workers)
            pytest.fail(f"{summary}\n- " + "\n- ".join(problems) + f"\nworker logs (last lines):\n{logs}")
    finally:
        broker.client.close()


def _wait(condition: Callable[[], bool], timeout: float, what: str, workers: list[WorkerProcess]) -> None:
    """Wait until `condition` holds; fail with the workers' logs after `timeout` seconds, or as
    soon as no worker is alive."""
    wait_for(lambda: condition() or not any(w.alive() for w in workers), timeout, interval=0.05, fail=False)
    if not condition():
        logs = "\n".join(w.log_tail() for w in workers)
        pytest.fail(f"timed out after {timeout}s waiting for {what}; worker logs:\n{logs}")


@pytest.mark.parametrize("how", ["sentinel-failover", "sentinel-kill"])
def test_nothing_is_lost_when_sentinel_fails_the_master_over(
    how, sentinel_group, spawn_worker, prefix, redis_client
):
    group = sentinel_group

    def fail_over() -> float:
        old_master = group.master_port()
        assert old_master == group.master.port
        if how == "sentinel-failover":
            group.failover()
        else:
            group.kill_master()
        return group.wait_promoted()

    run_failover_scenario(
        how,
        broker_url=group.url(),
        prefix=prefix,
        shared=redis_client,
        spawn_worker=spawn_worker,
        replicate=group.wait_replicated,
        fail_over=fail_over,
    )


@pytest.mark.parametrize("how", ["cluster-failover", "cluster-kill"])
def test_nothing_is_lost_when_the_queues_cluster_master_fails_over(
    how, replicated_cluster, spawn_worker, prefix, redis_client
):
    cluster = replicated_cluster
    master = cluster.master_of(f"{prefix}:{{{QUEUE}}}:pending")
    replica = cluster.replica_of(master)

    def fail_over() -> float:
        if how == "cluster-failover":
            cluster.failover(replica)
        else:
            cluster.kill(master)
        return cluster.wait_promoted(replica)

    run_failover_scenario(
        how,
        broker_url=cluster.url(),
        prefix=prefix,
        shared=redis_client,
        spawn_worker=spawn_worker,
        replicate=lambda: cluster.wait_replicated(master),
        fail_over=fail_over,
    )

"""Failover: the broker's master fails over under real workers, with every run of every task logged.

The chaos project (tests/chaos/project, django-rtq's defaults) on a replicated Redis: two
`rtq_worker` processes (10 threads each) work through 800 tasks of 100 ms enqueued before the
failover while a client enqueues 400 more, one every 10 ms, across it:

- Sentinel: a master, a replica and three sentinels (quorum 2); the failover is asked of a
  sentinel (`SENTINEL FAILOVER`: the old master takes writes until the sentinels demote it,
  about 10 s later), or the master is SIGKILLed and the sentinels promote the replica.
- Cluster: three masters with a replica each; the master of the queue's slot is failed over
  (`CLUSTER FAILOVER` on its replica), or SIGKILLed and its replica takes over.

A coordinated failover (`CLUSTER FAILOVER`) loses no write: nothing is lost, no two runs of a
task overlap. The others lose writes the old master acknowledged: a master SIGKILLed what it had
not replicated (Redis replication is asynchronous), a master Sentinel demotes what it took
before it knew. Those scenarios check what still holds (tests/chaos/harness.py `verify_lossy`)
and print what was lost. The first 800 are replicated (`WAIT`) before the failover, except
in `sentinel-kill-unreplicated`, where nothing waits for the replica (and it lags). With both
servers set to `min-replicas-to-write 1`, a demoted master refuses writes: a pause, and only
an instant of loss.

Each scenario asserts that the failover caught handlers running, and prints one line of
figures (appended to `$RTQ_CHAOS_REPORT` when set).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.chaos.failover_servers import ReplicatedCluster, SentinelGroup
from tests.chaos.harness import QUEUE, Chaos
from tests.chaos.lossy import acknowledged_by, point_at, verify_lossy

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

#: Tasks enqueued (and, but in the unreplicated scenario, replicated) before the failover.
BEFORE = 800
#: Tasks a client enqueues across the failover, one every STREAM_INTERVAL seconds.
STREAM = 400
STREAM_INTERVAL = 0.01
TASK_MS = 100
WORKERS = 2
#: Runs that end before the failover: the workers are busy when it comes.
ENDED_BEFORE = 150
#: Seconds the queue may take to drain after the new master serves: a task whose completion
#: was lost is active on the new master until its lease (5 s) and the grace (1 s) run out
#: and a recoverer pass (1 s) takes it back; then the 1,200 tasks' remaining work.
DRAIN_LIMIT = 25.0
#: Writes (enqueues, completions) a demoted master set to `min-replicas-to-write` may still
#: take: those of the instant before it sees its replica promoted (without it: about 770).
REMEDY_LOSS = 20
#: How far the replica lags when the master dies in the unreplicated scenario (seconds).
REPLICA_LAG = 0.5
DRAIN_WAIT = 90.0


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


def run_failover(
    chaos: Chaos, *, replicate: Callable[[], None] | None, fail_over: Callable[[], float]
) -> tuple[float, float, int]:
    """Enqueue BEFORE tasks (and `replicate` them), start the workers and the stream, fail the
    master over once ENDED_BEFORE runs ended; return when the fault came, how long the failover
    took, and how many handlers were running when it came."""
    chaos.enqueue([(f"a{i}", TASK_MS) for i in range(BEFORE)], batch=100, name="before")
    chaos.wait_clients(timeout=60)
    if replicate is not None:
        replicate()
    for slot in range(WORKERS):
        chaos.start_worker(name=f"f{slot}")
    chaos.enqueue([(f"s{i}", TASK_MS) for i in range(STREAM)], interval=STREAM_INTERVAL, name="stream")
    chaos.wait_ended(ENDED_BEFORE)
    fault_at = time.time()
    seconds = fail_over()
    return fault_at, seconds, chaos.running_at(fault_at)


def in_flight_problems(running: int) -> list[str]:
    return [] if running else ["the failover caught no handler running: it hit idle workers"]


def verify_replicated_kept(chaos, scenario: str, faults: str, *, fault_at: float, drained_at, running: int):
    """verify_lossy for a failover that waited for the replica before its load: the first
    BEFORE tasks, acknowledged and replicated, are kept."""
    return verify_lossy(
        chaos,
        scenario,
        faults,
        fault_at=fault_at,
        kept={f"a{i}" for i in range(BEFORE)},
        drained_at=drained_at,
        drain_limit=DRAIN_LIMIT,
        problems=in_flight_problems(running),
    )


@pytest.mark.parametrize("how", ["sentinel-failover", "sentinel-kill"])
def test_sentinel_fails_the_master_over(how, sentinel_group, chaos_project):
    group = sentinel_group
    chaos = chaos_project(group.master.url)
    point_at(chaos, group.url())

    def fail_over() -> float:
        assert group.master_port() == group.master.port
        if how == "sentinel-failover":
            group.failover()
        else:
            group.kill_master()
        return group.wait_promoted()

    fault_at, seconds, running = run_failover(chaos, replicate=group.wait_replicated, fail_over=fail_over)
    drained_at = chaos.wait_drained(DRAIN_WAIT)
    # Neither is without loss: a master SIGKILLed loses what it had not replicated, and one that
    # `SENTINEL FAILOVER` demotes keeps taking writes until the sentinels turn it into a replica
    # of the new one (about 10 s: their INFO period, then 8 s before they reconfigure it); the
    # clients' open connections still reach it meanwhile, and what they write there is lost.
    verify_replicated_kept(
        chaos,
        how,
        f"failovers=1 failover={seconds:.1f}s runs_at_failover={running}",
        fault_at=fault_at,
        drained_at=drained_at,
        running=running,
    )


def test_sentinel_kill_without_waiting_for_the_replica(sentinel_group, chaos_project):
    """No `WAIT` anywhere: the master is SIGKILLed under the load of 20 handlers settling and a
    client enqueueing, and the sentinels promote the replica with whatever it had. On loopback
    a replica is a millisecond behind at most; to measure what a lagging one loses, its link
    to the master is broken REPLICA_LAG seconds before the kill (it cannot resume it: it sends
    a password the master does not have). What the master acknowledged meanwhile is lost:
    enqueues (the task never runs), claims (the task is pending again, and may start
    elsewhere while its first run goes on) and completions (the task runs again). What was
    acknowledged before the replica's link broke is not lost."""
    group = sentinel_group
    chaos = chaos_project(group.master.url)
    point_at(chaos, group.url())
    kept: set[str] = set()

    def fail_over() -> float:
        with redis.Redis(port=group.master.port) as master, redis.Redis(port=group.replica.port) as replica:
            kept.update(acknowledged_by(chaos, replica, master))
            replica.config_set("masterauth", "not-the-masters")
            master.client_kill_filter(_type="replica")
        time.sleep(REPLICA_LAG)  # the fault: the writes of these seconds reach the master only
        group.kill_master()
        return group.wait_promoted()

    fault_at, seconds, running = run_failover(chaos, replicate=None, fail_over=fail_over)
    drained_at = chaos.wait_drained(DRAIN_WAIT)
    verify_lossy(
        chaos,
        "sentinel-kill-unreplicated",
        f"failovers=1 replica_lag={REPLICA_LAG}s failover={seconds:.1f}s runs_at_failover={running}",
        fault_at=fault_at,
        kept=kept,
        drained_at=drained_at,
        drain_limit=DRAIN_LIMIT,
        problems=in_flight_problems(running),
    )


@pytest.mark.parametrize("how", ["cluster-failover", "cluster-kill"])
def test_the_queues_cluster_master_fails_over(how, replicated_cluster, chaos_project):
    cluster = replicated_cluster
    master = cluster.master_of(f"chaos:{{{QUEUE}}}:pending")
    replica = cluster.replica_of(master)
    chaos = chaos_project(f"redis://127.0.0.1:{master}/0")
    point_at(chaos, cluster.url())

    def fail_over() -> float:
        if how == "cluster-failover":
            cluster.failover(replica)
        else:
            cluster.kill(master)
        return cluster.wait_promoted(replica)

    fault_at, seconds, running = run_failover(
        chaos, replicate=lambda: cluster.wait_replicated(master), fail_over=fail_over
    )
    drained_at = chaos.wait_drained(DRAIN_WAIT)
    faults = f"failovers=1 failover={seconds:.1f}s runs_at_failover={running}"
    if how == "cluster-failover":
        chaos.verify(
            how,
            faults,
            last_fault=fault_at,
            drained_at=drained_at,
            drain_limit=DRAIN_LIMIT,
            problems=in_flight_problems(running),
        )
    else:
        verify_replicated_kept(
            chaos,
            how,
            faults,
            fault_at=fault_at,
            drained_at=drained_at,
            running=running,
        )


def test_sentinel_failover_of_masters_that_need_a_replica(sentinel_group, chaos_project):
    """`SENTINEL FAILOVER` as above, both servers set to `min-replicas-to-write 1` (Redis's
    remedy for a demoted master that goes on taking writes): the old master refuses writes
    (`NOREPLICAS`, which django-rtq retries) once it sees its replica promoted, and the new one
    until the old one is its replica. Writes pause instead of being lost, but for those the old
    master took in the instant before it saw its replica go: at most REMEDY_LOSS."""
    group = sentinel_group
    for server in (group.master, group.replica):
        with redis.Redis(port=server.port) as client:
            client.config_set("min-replicas-to-write", 1)
    chaos = chaos_project(group.master.url)
    point_at(chaos, group.url())

    def fail_over() -> float:
        group.failover()
        return group.wait_promoted()

    fault_at, seconds, running = run_failover(chaos, replicate=group.wait_replicated, fail_over=fail_over)
    drained_at = chaos.wait_drained(DRAIN_WAIT)
    figures = verify_replicated_kept(
        chaos,
        "sentinel-failover-min-replicas",
        f"failovers=1 failover={seconds:.1f}s runs_at_failover={running}",
        fault_at=fault_at,
        drained_at=drained_at,
        running=running,
    )
    assert figures["lost"] + figures["ended_twice"] <= REMEDY_LOSS, figures

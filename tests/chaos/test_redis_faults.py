"""Redis restarted, unreachable for a minute, or hung, under working workers: nothing lost, none twice."""

from __future__ import annotations

import math
import os
import signal
import time
from collections import Counter

import pytest

from tests.chaos.lossy import verify_lossy
from tests.support.proxy import TCPProxy

pytestmark = pytest.mark.chaos

#: How long Redis is unreachable to the workers in the outage scenario.
OUTAGE_SECONDS = 60.0
#: `appendfsync everysec` fsyncs the append-only file once a second, and while an fsync is slow
#: Redis answers writes it has not written yet for up to 2 s: what a crash may take back.
EVERYSEC_WINDOW = 2.0
#: The everysec scenario's tasks (200 ms) take about 16 s on 20 threads, most after the restart.
EVERYSEC_DRAIN_LIMIT = 30.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("fsync", "ms"), [("always", 20), ("everysec", 200)])
def test_redis_restarted_mid_run(fsync, ms, redis_servers, chaos_project):
    """Two workers on 1,000 tasks of `ms` milliseconds, with a client enqueueing 600 more at 100
    a second; while handlers run Redis (append-only, fsync `always` or `everysec`) is SIGKILLed
    and restarted from its append-only file.

    With `always` nothing acknowledged is lost. With `everysec` what holds is what Redis
    promises: a write acknowledged EVERYSEC_WINDOW before the kill is kept; later ones may be
    lost (an enqueue: its task never runs; a claim or a completion: its task runs again)."""
    server = redis_servers("--appendonly", "yes", "--appendfsync", fsync)
    chaos = chaos_project(server.url)
    chaos.enqueue([(f"a{i}", ms) for i in range(1000)], name="bulk")
    chaos.wait_clients(timeout=60)
    chaos.enqueue([(f"s{i}", ms) for i in range(600)], interval=0.01, name="stream")
    for slot in range(2):
        chaos.start_worker(name=f"r{slot}")
    chaos.wait_ended(350 if fsync == "always" else 150)
    kept = set(chaos.acknowledged())
    if fsync == "everysec":
        time.sleep(EVERYSEC_WINDOW)  # the fault's schedule: what was acknowledged by now is kept

    killed = time.time()
    server.restart(down_seconds=1.0)
    restarted = time.time()

    drained_at = chaos.wait_drained(90)
    running = chaos.running_at(killed)
    faults = f"restarts=1 runs_at_restart={running}"
    problems = [] if running else ["the restart caught no handler running"]
    if fsync == "always":
        chaos.verify(
            "redis-restart",
            faults,
            last_fault=restarted,
            drained_at=drained_at,
            check_results=True,
            problems=problems,
        )
    else:
        verify_lossy(
            chaos,
            "redis-restart-everysec",
            faults,
            fault_at=killed,
            kept=kept,
            drained_at=drained_at,
            drain_limit=EVERYSEC_DRAIN_LIMIT,
            problems=problems,
        )


@pytest.fixture
def tcp_proxy():
    """A TCPProxy to a port (tests/support/proxy.py), taken down at teardown: `tcp_proxy(port)`."""
    proxies = []

    def start(port: int) -> TCPProxy:
        proxy = TCPProxy("127.0.0.1", port).up()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.down()


@pytest.mark.timeout(400)
def test_redis_unreachable_for_a_minute(redis_servers, chaos_project, tcp_proxy):
    """Two workers reach Redis through a proxy, on 400 tasks of 500 ms; the proxy is cut for
    60 s while a client (on Redis directly) enqueues 100 more, then it is up again: the workers
    resume by themselves, and every task succeeded as far as Django's task API can tell."""
    server = redis_servers()
    proxy = tcp_proxy(server.port)
    chaos = chaos_project(server.url, worker_url=f"redis://127.0.0.1:{proxy.port}/0")
    chaos.enqueue([(f"a{i}", 500) for i in range(400)], name="before")
    chaos.wait_clients(timeout=60)
    for slot in range(2):
        chaos.start_worker(name=f"o{slot}")
    chaos.wait_ended(60)

    cut = time.time()
    proxy.down()
    chaos.enqueue([(f"b{i}", 500) for i in range(100)], interval=0.2, name="during")
    time.sleep(OUTAGE_SECONDS)  # the fault itself: Redis unreachable to the workers
    proxy.up()
    back = time.time()

    drained_at = chaos.wait_drained(120)
    chaos.verify(
        "redis-outage-60s",
        f"outages=1 runs_at_cut={chaos.running_at(cut)}",
        last_fault=back,
        drained_at=drained_at,
        check_results=True,
    )


#: How long Redis hangs: past the workers' socket timeouts (2 s for one, redis-py's default of
#: 5 s for the other), the healthchecker's 15 s interval and the 5 s lease, so that every lease
#: lapses on Redis's clock meanwhile.
HANG_SECONDS = 20.0
#: The workers' lease (django-rtq's default), and the share of it they rely on (the lease
#: budget: 4 s), and the watchdog's pace (0.05 s) and a task's step (0.05 s) on top.
LEASE_SECONDS = 5.0
STOP_BOUND = 0.8 * LEASE_SECONDS + 0.2
#: Once Redis answers: the leases lapsed during the hang are taken back (grace 1 s, a recoverer
#: pass 1 s), then up to 50 tasks of 6 s on 20 threads take three rounds.
HANG_DRAIN_LIMIT = 30.0
#: Longer than the lease budget: a handler running when Redis hangs is still running when its
#: worker must stop it.
HANG_TASK_MS = 6000
STEPS = "chaosapp.tasks.chaos_steps"


@pytest.mark.timeout(240)
def test_redis_hangs(redis_servers, chaos_project):
    """Redis SIGSTOPped for 20 s (the kernel still accepts connections; nothing answers) under
    two workers on 40 tasks of 6 s (`chaos_steps`: Python code a worker can stop): one at the
    defaults, one with `socket_timeout=2` in its URL. A client enqueues 10 more meanwhile.
    Neither worker hangs for ever: each stops its handlers within the lease budget of its last
    renewal (before the lease can lapse), and once Redis answers they run every task, none twice
    at once."""
    server = redis_servers()
    chaos = chaos_project(server.url)
    # 10 tasks for the first worker, then 30 more once the second is up: both are busy.
    chaos.call([(f"a{i}", STEPS, [f"a{i}", HANG_TASK_MS], {}) for i in range(10)], name="first")
    chaos.start_worker(name="defaults")
    chaos.wait_started(10)
    chaos.start_worker(name="timeout-2s", redis_url=server.url + "?socket_timeout=2&socket_connect_timeout=2")
    chaos.call([(f"a{i}", STEPS, [f"a{i}", HANG_TASK_MS], {}) for i in range(10, 40)], name="then")
    chaos.wait_started(20)

    hung = time.time()
    pid = server.server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        chaos.call([(f"b{i}", STEPS, [f"b{i}", HANG_TASK_MS], {}) for i in range(10)], name="during")
        time.sleep(HANG_SECONDS)  # the fault itself: Redis hangs
    finally:
        os.kill(pid, signal.SIGCONT)
    back = time.time()

    drained_at = chaos.wait_drained(90)
    going = [run for run in chaos.runlog.refresh().runs if run.start <= hung < (run.end or math.inf)]
    unended = [run for run in chaos.runlog.unended() if run.start <= hung]
    stopped_after = max((run.end - hung for run in going), default=0.0)
    problems = []
    if len(going) + len(unended) < 10:
        problems.append(f"the hang caught {len(going) + len(unended)} handlers running, not 10 or more")
    if unended or stopped_after > STOP_BOUND:
        problems.append(
            f"a handler running when Redis hung went on {stopped_after:.1f}s, past the lease budget "
            f"({len(unended)} never stopped)"
        )
    per_worker = Counter(run.pid for run in going)
    chaos.verify(
        "redis-hang-20s",
        f"hangs=1 runs_at_hang={len(going) + len(unended)} (by worker: {sorted(per_worker.values())}) "
        f"stopped_within={stopped_after:.1f}s",
        last_fault=back,
        drained_at=drained_at,
        drain_limit=HANG_DRAIN_LIMIT,
        problems=problems,
    )

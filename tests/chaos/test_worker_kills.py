"""Workers SIGKILLed while they run tasks: nothing lost, no two runs of a task at once, drained fast."""

from __future__ import annotations

import random

import pytest

from tests.chaos.harness import every

pytestmark = pytest.mark.chaos

#: How long after its last fault a scenario may take to drain (the issue's acceptance criterion).
DRAIN_LIMIT_SECONDS = 10.0
#: How long the tests wait for a drain before they call the queue stuck.
DRAIN_WAIT_SECONDS = 90.0


@pytest.mark.timeout(300)
def test_sigkill_storm(redis_servers, chaos_project):
    """2,000 tasks of 20 ms, two workers of 4 threads; one SIGKILLed and restarted every second, 8 times."""
    chaos = chaos_project(redis_servers().url)
    chaos.enqueue([(f"k{i}", 20) for i in range(2000)])
    chaos.wait_clients(timeout=120)
    chaos.start_worker("--concurrency", "4", name="steady")
    victim = chaos.start_worker("--concurrency", "4", name="victim-0")
    chaos.wait_started(1)

    for n in every(1.0, 8):
        last_kill = chaos.kill(victim.pid)
        victim = chaos.start_worker("--concurrency", "4", name=f"victim-{n}")
    live = chaos.run_queue()

    drained_at = chaos.wait_drained(DRAIN_WAIT_SECONDS)
    chaos.verify(
        "sigkill-storm",
        f"kills={len(chaos.kills)} live_at_last_kill={live}",
        last_fault=last_kill,
        drained_at=drained_at,
        drain_limit=DRAIN_LIMIT_SECONDS,
    )


#: Long enough for the six processes' 60 threads to be busy for the whole storm: at 5 ms the
#: 20,000 tasks are done in about 2 s, and the kills would hit idle workers.
SUPERVISED_TASK_MS = 180


@pytest.mark.timeout(420)
def test_sigkill_every_two_seconds_across_supervised_processes(redis_servers, chaos_project):
    """20,000 tasks of 180 ms; three `--processes 2` workers; for 60 s, every 2 s, a SIGKILL of one
    of the six worker processes (its supervisor restarts it) or, alternately, of a supervisor
    (its children stop; the worker is started again)."""
    chaos = chaos_project(redis_servers().url)
    chaos.enqueue([(f"k{i}", SUPERVISED_TASK_MS) for i in range(20_000)], batch=1000)
    chaos.wait_clients(timeout=120)
    workers = [chaos.start_worker("--processes", "2", name=f"s{slot}-0") for slot in range(3)]
    chaos.wait_started(1)

    rng = random.Random(2)
    kinds = {"child": 0, "supervisor": 0}
    for n in every(2.0, 30):
        processes = [pid for worker in workers for pid in worker.children()]
        if n % 2 and processes:
            last_kill = chaos.kill(rng.choice(processes))
            kinds["child"] += 1
        else:
            slot = rng.randrange(len(workers))
            last_kill = chaos.kill(workers[slot].pid)
            workers[slot] = chaos.start_worker("--processes", "2", name=f"s{slot}-{n}")
            kinds["supervisor"] += 1
    live = chaos.run_queue()

    drained_at = chaos.wait_drained(DRAIN_WAIT_SECONDS)
    chaos.verify(
        "sigkill-supervised",
        f"kills={len(chaos.kills)} (children={kinds['child']} supervisors={kinds['supervisor']}) "
        f"live_at_last_kill={live}",
        last_fault=last_kill,
        drained_at=drained_at,
    )

"""Workers SIGKILLed while they run tasks: nothing lost, no two runs of a task at once, and the
tasks each kill cut run again within the bound of the settings (RERUN_SECONDS, 7 s)."""

from __future__ import annotations

import random

import pytest

from tests.chaos.harness import Chaos, Worker, every
from tests.chaos.in_flight import (
    RERUN_SECONDS,
    SLACK_SECONDS,
    cut_by_kills,
    going,
    rerun_delays,
    rerun_figures,
    wait_going,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.chaos

#: Threads of each worker of the storm; the victim is killed once it runs this many tasks.
CONCURRENCY = 4
#: Long enough that each kill lands mid-run; the steady worker runs about 13 a second.
TASK_MS = 300
#: Enough work for about a dozen kills (each victim claims some 16 tasks, and dies with them).
TASKS = 400
#: The storm goes on while at least this many tasks wait: its last kill leaves the queue little
#: more to do than the tasks it cut, so the drain after it shows how soon those ran again.
LOW_WATER = 2 * CONCURRENCY
MIN_KILLS = 6
MAX_KILLS = 30
#: After the last kill: its tasks run again (RERUN_SECONDS) and end; the few tasks left meanwhile.
DRAIN_LIMIT_SECONDS = RERUN_SECONDS + SLACK_SECONDS + TASK_MS / 1000


def max_delay(chaos: Chaos) -> float:
    """The longest a task any kill cut took to run again (see rerun_delays)."""
    return max((delay for delay in rerun_delays(chaos) if delay is not None), default=0.0)


def storm_problems(kills: int, cut: list[int], pending: list[int]) -> list[str]:
    """What shows a storm that did not hit work in flight: too few kills, a kill that cut no run,
    a queue with nothing waiting at a kill."""
    problems = []
    if kills < MIN_KILLS:
        problems.append(f"{kills} kills, fewer than {MIN_KILLS}: the work ran out")
    if not all(cut):
        problems.append(f"a kill cut no run: runs cut per kill {cut}")
    if not pending or min(pending) == 0:
        problems.append(f"the queue was drained before a kill: pending at each {pending}")
    return problems


@pytest.mark.timeout(300)
def test_sigkill_storm(redis_servers, chaos_project):
    """Tasks of 300 ms, two workers of 4 threads; one SIGKILLed once it runs 4 (a second apart at
    least) and restarted, while tasks wait; the steady one recovers the victims' tasks."""
    chaos = chaos_project(redis_servers().url)
    chaos.enqueue([(f"k{i}", TASK_MS) for i in range(TASKS)])
    chaos.wait_clients(timeout=120)
    chaos.start_worker("--concurrency", str(CONCURRENCY), name="steady")
    victim = chaos.start_worker("--concurrency", str(CONCURRENCY), name="victim-0")
    chaos.wait_started(1)

    pending = []  # tasks waiting at each kill
    for n in every(1.0, MAX_KILLS):
        if not wait_going(chaos, victim.pid, CONCURRENCY):
            break
        waiting = (chaos.sizes() or {}).get("pending", 0)
        if waiting < LOW_WATER:
            break
        pending.append(waiting)
        victim_pid = victim.pid
        last_kill = chaos.kill(victim_pid)
        live = chaos.run_queue()
        victim = chaos.start_worker("--concurrency", str(CONCURRENCY), name=f"victim-{n}")

    drained_at = chaos.wait_drained(3 * DRAIN_LIMIT_SECONDS)
    cut = cut_by_kills(chaos)
    # No kill comes after the last: the runs it cut run again within the bound. Those of an
    # earlier kill may be claimed by the next victim before it runs them, and wait for it too.
    reruns, late = rerun_figures(
        rerun_delays(chaos, [victim_pid]), RERUN_SECONDS + SLACK_SECONDS, "last_kill"
    )
    chaos.verify(
        "sigkill-storm",
        f"kills={len(chaos.kills)} cut_per_kill={','.join(map(str, cut))} "
        f"pending_at_last_kill={pending[-1] if pending else 0} live_at_last_kill={live} {reruns} "
        f"rerun_after_any_kill=max:{max_delay(chaos):.1f}s",
        last_fault=last_kill,
        drained_at=drained_at,
        drain_limit=DRAIN_LIMIT_SECONDS,
        problems=storm_problems(len(chaos.kills), cut, pending) + late,
    )


#: Threads of the six worker processes of the supervised storm (rtq_worker's default, 10 each).
SUPERVISED_THREADS = 60
#: Long enough that the 60 threads are busy at each kill and a kill lands mid-run.
SUPERVISED_TASK_MS = 180
#: About 40 s of work for the 60 threads: some 20 kills, two seconds apart.
SUPERVISED_TASKS = 12_000
SUPERVISED_LOW_WATER = SUPERVISED_THREADS
SUPERVISED_MIN_KILLS = 10
SUPERVISED_MAX_KILLS = 60
SUPERVISED_DRAIN_LIMIT_SECONDS = RERUN_SECONDS + SLACK_SECONDS + SUPERVISED_TASK_MS / 1000


def busy_children(chaos: Chaos, workers: list[Worker]) -> dict[int, list[int]]:
    """The processes of each worker (by its slot) that have runs going."""
    runs_going = going(chaos)
    return {slot: [pid for pid in w.children() if runs_going[pid]] for slot, w in enumerate(workers)}


@pytest.mark.timeout(420)
def test_sigkill_every_two_seconds_across_supervised_processes(redis_servers, chaos_project):
    """12,000 tasks of 180 ms; three `--processes 2` workers; every 2 s while tasks wait, a SIGKILL
    of one of the six worker processes with runs going (its supervisor restarts it) or,
    alternately, of a supervisor whose children have runs going (they finish them and stop; the
    worker is started again)."""
    chaos = chaos_project(redis_servers().url)
    chaos.enqueue([(f"k{i}", SUPERVISED_TASK_MS) for i in range(SUPERVISED_TASKS)], batch=1000)
    chaos.wait_clients(timeout=120)
    workers = [chaos.start_worker("--processes", "2", name=f"s{slot}-0") for slot in range(3)]
    chaos.wait_started(1)

    rng = random.Random(2)
    child_kills: list[int] = []  # pids
    orphans: list[tuple[int, int]] = []  # pid of a child of a supervisor killed, its runs going then
    pending = []
    for n in every(2.0, SUPERVISED_MAX_KILLS):
        wait_for(
            lambda: any(busy_children(chaos, workers).values()),
            timeout=30,
            message="a worker process to have runs going",
        )
        busy = busy_children(chaos, workers)
        waiting = (chaos.sizes() or {}).get("pending", 0)
        if waiting < SUPERVISED_LOW_WATER:
            break
        pending.append(waiting)
        if n % 2:
            child = rng.choice([pid for pids in busy.values() for pid in pids])
            last_kill = chaos.kill(child)
            live = chaos.run_queue()
            child_kills.append(child)
        else:
            slot = rng.choice([slot for slot, pids in busy.items() if pids])
            runs_going = going(chaos)
            orphans += [(pid, runs_going[pid]) for pid in workers[slot].children()]
            last_kill = chaos.kill(workers[slot].pid)
            live = chaos.run_queue()
            workers[slot] = chaos.start_worker("--processes", "2", name=f"s{slot}-{n}")

    drained_at = chaos.wait_drained(3 * SUPERVISED_DRAIN_LIMIT_SECONDS)
    cut = dict(zip([pid for pid, _ in chaos.kills], cut_by_kills(chaos), strict=True))
    cut_by_child = [cut[pid] for pid in child_kills]
    # The children of a killed supervisor stop by themselves and finish the runs they have going.
    left_unended = going(chaos)
    orphan_runs = sum(count for _, count in orphans)
    problems = storm_problems(len(chaos.kills), cut_by_child, pending)
    if not orphans or not all(count for _, count in orphans):
        problems.append(f"a supervisor was killed while a child had no run going: {orphans}")
    unfinished = {pid: left_unended[pid] for pid, _ in orphans if left_unended[pid]}
    if unfinished:
        problems.append(f"children of killed supervisors left runs unended: {unfinished}")
    # The runs the last child kill cut: no kill caught them again, they run within the bound.
    reruns, late = rerun_figures(
        rerun_delays(chaos, child_kills[-1:]), RERUN_SECONDS + SLACK_SECONDS, "last_child_kill"
    )
    chaos.verify(
        "sigkill-supervised",
        f"kills={len(chaos.kills)} "
        f"(children={len(child_kills)} supervisors={len(chaos.kills) - len(child_kills)}) "
        f"cut_per_child_kill=min:{min(cut_by_child, default=0)},total:{sum(cut_by_child)} "
        f"orphan_runs_finished={orphan_runs - sum(unfinished.values())} "
        f"pending_at_last_kill={pending[-1] if pending else 0} live_at_last_kill={live} {reruns} "
        f"rerun_after_any_kill=max:{max_delay(chaos):.1f}s",
        last_fault=last_kill,
        drained_at=drained_at,
        drain_limit=SUPERVISED_DRAIN_LIMIT_SECONDS,
        problems=problems + late,
    )

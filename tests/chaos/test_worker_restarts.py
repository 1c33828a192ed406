"""Workers restarted with SIGTERM while they run tasks of seconds: nothing lost, no two runs at once,
each SIGTERM with runs going, the worker out in time and the tasks it gave back run again at once."""

from __future__ import annotations

import random
import signal
import time

import pytest

from django_rtq.defaults import DEFAULT_SHUTDOWN_TIMEOUT_SECONDS
from django_rtq.worker.server import EXIT_GRACE_SECONDS
from tests.chaos.harness import Chaos, Worker, every
from tests.chaos.in_flight import RERUN_SECONDS, SLACK_SECONDS, aborted_by, going, next_start, wait_going
from tests.support.polling import wait_for

pytestmark = pytest.mark.chaos

#: The tasks' runs last from 0.5 s to 3 s.
TASK_MS = (500, 3000)
#: Tasks of each storm: past the short timeout most runs are stopped and run again, so fewer.
TASKS = 300
TASKS_PAST_TIMEOUT = 80
#: A worker gets SIGTERM once it has this many runs going (of its 10 threads).
GOING_AT_SIGTERM = 5
#: The storm goes on while at least this many tasks are live (twice the two workers' threads): its
#: last SIGTERM leaves little more to do than the runs going then.
LOW_WATER = 40
MIN_SIGTERMS = 8
MAX_SIGTERMS = 60
#: The timeout of the storm whose handlers outlive it.
SHORT_TIMEOUT = 0.5


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("timeout", "tasks", "name"),
    [
        (None, TASKS, "sigterm-storm"),
        # Handlers outlive the shutdown timeout: the worker stops them and gives their tasks back.
        (SHORT_TIMEOUT, TASKS_PAST_TIMEOUT, "sigterm-storm-past-timeout"),
    ],
    ids=["default-timeout", "past-timeout"],
)
def test_sigterm_storm(redis_servers, chaos_project, timeout, tasks, name):
    """Tasks of 0.5-3 s, two workers; a second apart at least, while tasks wait, one with 5 runs
    going gets SIGTERM and a new one starts. At the default timeout (8 s) the runs going finish;
    past a timeout of 0.5 s the worker stops them and gives their tasks back, and they run again
    sooner than a lease would let them."""
    options = () if timeout is None else ("--shutdown-timeout", str(timeout))
    shutdown = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS if timeout is None else timeout
    chaos = chaos_project(redis_servers().url)
    rng = random.Random(3)
    chaos.enqueue([(f"k{i}", rng.randint(*TASK_MS)) for i in range(tasks)])
    chaos.wait_clients(timeout=60)
    workers = [chaos.start_worker(*options, name=f"t{slot}-0") for slot in range(2)]
    chaos.wait_started(1)

    terminated: list[tuple[Worker, float]] = []  # (worker, when it was sent SIGTERM)
    live = []  # live tasks at each SIGTERM
    for n in every(1.0, MAX_SIGTERMS):
        slot = n % len(workers)
        if not wait_going(chaos, workers[slot].pid, GOING_AT_SIGTERM):
            break
        waiting = chaos.run_queue()
        if waiting < LOW_WATER:
            break
        live.append(waiting)
        workers[slot].process.send_signal(signal.SIGTERM)
        last_term = time.time()
        terminated.append((workers[slot], last_term))
        workers[slot] = chaos.start_worker(*options, name=f"t{slot}-{n}")

    # After the last SIGTERM its runs end, or are stopped and given back; a handler still in its
    # sleep when the worker exits keeps its task until the lease lapses (docs/reliability.md).
    stop_limit = shutdown + EXIT_GRACE_SECONDS + RERUN_SECONDS + SLACK_SECONDS
    drain_limit = (
        stop_limit if timeout is not None else min(shutdown, TASK_MS[1] / 1000) + SLACK_SECONDS
    ) + 2 * TASK_MS[1] / 1000
    drained_at = chaos.wait_drained(3 * drain_limit)
    # A worker told to stop finishes (or stops) its running handlers and exits.
    exit_limit = shutdown + EXIT_GRACE_SECONDS + SLACK_SECONDS
    wait_for(
        lambda: all(worker.process.poll() is not None for worker, _ in terminated),
        timeout=exit_limit,
        message="the workers sent SIGTERM to exit",
    )
    figures, problems = sigterm_checks(
        chaos, terminated, stops=timeout is not None, exit_limit=exit_limit, rerun_limit=stop_limit
    )
    if len(terminated) < MIN_SIGTERMS:
        problems.append(f"{len(terminated)} SIGTERMs, fewer than {MIN_SIGTERMS}: the work ran out")
    if not live or min(live) == 0:
        problems.append(f"the queue was drained before a SIGTERM: live tasks at each {live}")
    chaos.verify(
        name,
        f"sigterms={len(terminated)} {figures} live_at_last_sigterm={live[-1] if live else 0}",
        last_fault=last_term,
        drained_at=drained_at,
        drain_limit=drain_limit,
        problems=problems,
    )


def sigterm_checks(
    chaos: Chaos,
    terminated: list[tuple[Worker, float]],
    *,
    stops: bool,
    exit_limit: float,
    rerun_limit: float,
) -> tuple[str, list[str]]:
    """The figures of the SIGTERMs and what is wrong: a SIGTERM with no run going, a worker that
    exited unclean or late; at the default timeout, a run that did not end; past a short one, a
    SIGTERM that stopped no run mid-way, or a run the last one stopped that did not run again
    within `rerun_limit` seconds of it."""
    going_at = [chaos.running_at(when, worker.pid) for worker, when in terminated]
    left = going(chaos)  # runs still open once their worker exited: left to their lease
    stopped = [aborted_by(chaos, worker.pid) for worker, _ in terminated]
    cut = [len(runs) + left[worker.pid] for runs, (worker, _) in zip(stopped, terminated, strict=True)]
    exits = [chaos.watch.deaths.get(worker.pid, float("inf")) - when for worker, when in terminated]
    problems = []
    if not all(going_at):
        problems.append(f"a SIGTERM found no run going: runs going at each {going_at}")
    unclean = [f"{w.name} exited {w.process.returncode}" for w, _ in terminated if w.process.returncode]
    if unclean:
        problems.append(f"unclean exits after SIGTERM: {unclean}")
    if max(exits, default=0) > exit_limit:
        problems.append(f"a worker exited {max(exits):.1f}s after SIGTERM, over {exit_limit:.1f}s")
    if stops and not all(cut):
        problems.append(f"a SIGTERM past the timeout stopped no run mid-way: runs stopped per SIGTERM {cut}")
    if not stops and any(cut):
        problems.append(f"runs did not end though the timeout let them: runs stopped per SIGTERM {cut}")
    delays = []
    if terminated:
        worker, when = terminated[-1]
        keys = [key for key, _ in stopped[-1]] + [
            r.key for r in chaos.runlog.unended() if r.pid == worker.pid
        ]
        for key in keys:
            started = next_start(chaos, key, when)
            delays.append(float("inf") if started is None else started - when)
    if max(delays, default=0) > rerun_limit:
        problems.append(
            f"a run the last SIGTERM stopped ran again {max(delays):.1f}s after it, over {rerun_limit:.1f}s"
        )
    figures = (
        f"runs_going_per_sigterm=min:{min(going_at, default=0)},total:{sum(going_at)} "
        f"stopped_per_sigterm=min:{min(cut, default=0)},total:{sum(cut)} "
        f"(left_to_lease={sum(left[worker.pid] for worker, _ in terminated)}) "
        f"rerun_after_last_sigterm=max:{max(delays, default=0):.1f}s "
        f"exit_after_sigterm=max:{max(exits, default=0):.1f}s"
    )
    return figures, problems

"""Workers restarted with SIGTERM while they run tasks of seconds: nothing lost, no two runs at once."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.chaos.harness import every
from tests.support.polling import wait_for

pytestmark = pytest.mark.chaos

#: The most SIGTERMs a storm sends; it stops earlier once the queue is empty.
MAX_RESTARTS = 40


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("options", "name"),
    [
        ((), "sigterm-storm"),
        # Handlers outlive the shutdown timeout: the worker stops them and gives their tasks back.
        (("--shutdown-timeout", "0.5"), "sigterm-storm-past-timeout"),
    ],
    ids=["default-timeout", "past-timeout"],
)
def test_sigterm_storm(redis_servers, chaos_project, options, name):
    """200 tasks of 0.5-3 s, two workers; every second one gets SIGTERM and a new one starts."""
    chaos = chaos_project(redis_servers().url)
    rng = random.Random(3)
    chaos.enqueue([(f"k{i}", rng.randint(500, 3000)) for i in range(200)])
    chaos.wait_clients(timeout=60)
    workers = [chaos.start_worker(*options, name=f"t{slot}-0") for slot in range(2)]
    chaos.wait_started(1)

    terminated = []  # (worker, when it was sent SIGTERM)
    for n in every(1.0, MAX_RESTARTS):
        if chaos.run_queue() == 0:
            break
        slot = n % len(workers)
        workers[slot].process.send_signal(signal.SIGTERM)
        last_term = time.time()
        terminated.append((workers[slot], last_term))
        workers[slot] = chaos.start_worker(*options, name=f"t{slot}-{n}")

    drained_at = chaos.wait_drained(90)
    # A worker told to stop finishes (or stops) its running handlers and exits.
    wait_for(
        lambda: all(worker.process.poll() is not None for worker, _ in terminated),
        timeout=60,
        message="the workers sent SIGTERM to exit",
    )
    unclean = [f"{w.name} exited {w.process.returncode}" for w, _ in terminated if w.process.returncode]
    running = sum(chaos.running_at(when, worker.pid) for worker, when in terminated)
    chaos.verify(
        name,
        f"sigterms={len(terminated)} runs_at_sigterm={running} unclean_exits={len(unclean)}",
        last_fault=last_term,
        drained_at=drained_at,
        problems=[f"unclean exits after SIGTERM: {unclean}"] if unclean else [],
    )

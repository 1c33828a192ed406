"""What a fault hit in a chaos scenario: the runs it cut, how soon their tasks ran again, and the
bounds the default settings promise."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable

from django_rtq.defaults import (
    DEFAULT_HEARTBEAT_INTERVAL_SECONDS,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_RECOVERER_INTERVAL_SECONDS,
    DEFAULT_RECOVERY_GRACE_SECONDS,
)
from tests.chaos.harness import Chaos, Worker
from tests.support.polling import wait_for

# What a fault hit: the runs it cut, and how soon their tasks ran again (the project runs at the
# default settings, so the bounds below are the defaults' own).

#: A SIGKILLed worker renewed its leases at the latest when it died: they lapse within a lease, a
#: recoverer takes its tasks back once they are RECOVERY_GRACE past that, at its next pass. They run
#: again within this many seconds of the kill: 7 s, "about 7 s" in docs/reliability.md.
RERUN_SECONDS = DEFAULT_LEASE_SECONDS + DEFAULT_RECOVERY_GRACE_SECONDS + DEFAULT_RECOVERER_INTERVAL_SECONDS
#: A recoverer takes nothing back until it has been in touch with Redis this long (a lease and a
#: heartbeat: worker/server.py), so a worker started after a kill recovers its tasks only then.
RECOVERER_SETTLE_SECONDS = DEFAULT_LEASE_SECONDS + DEFAULT_HEARTBEAT_INTERVAL_SECONDS
#: Allowed past a bound computed from the settings: the claim of a task given back (a woken
#: worker, or a thread that frees) and the scheduling of a loaded 2-core machine.
SLACK_SECONDS = 2.0


def going(chaos: Chaos) -> Counter[int]:
    """How many runs each process has going now (started, neither ended nor aborted)."""
    return Counter(run.pid for run in chaos.runlog.refresh().unended())


def wait_going(chaos: Chaos, pid: int, count: int, timeout: float = 30) -> bool:
    """Wait until process `pid` has `count` runs going at once; False if not within `timeout`."""
    return wait_for(lambda: going(chaos)[pid] >= count, timeout, interval=0.01, fail=False)


def aborted_by(chaos: Chaos, pid: int) -> list[tuple[str, float]]:
    """The runs of process `pid` that ended in `abort` (the worker stopped their handler): the
    key and when, of each."""
    path = chaos.events / f"{pid}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(key, float(when)) for event, key, _, when in map(str.split, lines) if event == "abort"]


def next_start(chaos: Chaos, key: str, after: float) -> float | None:
    """When the first run of `key` that started after `after` started (None if none did)."""
    starts = [run.start for run in chaos.runlog.runs + chaos.runlog.unended() if run.key == key]
    return min((start for start in starts if start > after), default=None)


def cut_by_kills(chaos: Chaos) -> list[int]:
    """How many runs each kill of `chaos.kills` cut: started in the killed process, never ended."""
    cut = going(chaos)
    return [cut[pid] for pid, _ in chaos.kills]


def rerun_delays(chaos: Chaos, pids: Iterable[int] | None = None) -> list[float | None]:
    """For each run a kill (of one of `pids`, if given) cut, the seconds from the kill to the
    next start of its task (None if it never started again). A task a later kill caught again
    (claimed, not started, by the next process killed) waits for that kill's lease too."""
    chaos.runlog.refresh()
    starts: dict[str, list[float]] = defaultdict(list)
    for run in chaos.runlog.runs + chaos.runlog.unended():
        starts[run.key].append(run.start)
    deaths = dict(chaos.kills)
    if pids is not None:
        deaths = {pid: when for pid, when in deaths.items() if pid in set(pids)}
    delays: list[float | None] = []
    for run in chaos.runlog.unended():
        if run.pid in deaths:
            later = [start for start in starts[run.key] if start > run.start]
            delays.append(min(later) - deaths[run.pid] if later else None)
    return delays


def wait_ready(worker: Worker, timeout: float = 60) -> float:
    """Wait until `worker` logs that it starts (its recoverer's wait begins then); return when."""
    wait_for(
        lambda: "starting on queues" in worker.log.read_text(errors="replace"),
        timeout,
        interval=0.02,
        message=f"worker {worker.name} to start",
    )
    return time.time()


def rerun_figures(delays: list[float | None], bound: float, name: str = "kill") -> tuple[str, list[str]]:
    """The figures of `rerun_delays` (of the kill(s) `name` says) and the problems: a cut run's
    task that never ran again, or ran again over `bound` seconds after the kill."""
    known = [delay for delay in delays if delay is not None]
    figures = f"rerun_after_{name}=max:{max(known, default=0):.1f}s,bound:{bound:.1f}s"
    problems = []
    if len(known) < len(delays):
        problems.append(f"{len(delays) - len(known)} task(s) a kill cut never ran again")
    late = [delay for delay in known if delay > bound]
    if late:
        problems.append(
            f"{len(late)} task(s) a kill cut ran again over {bound:.1f}s after it (max {max(late):.1f}s)"
        )
    return figures, problems

"""Histograms per task type of how long handlers ran and tasks waited to start, kept in Redis.

A worker counts its attempts in memory (`Timings.observe`) and adds the counts to each queue's
`rtq:{q}:timings` hash now and then (`Timings.flush`): one pipelined round trip, not one per
task. They are metrics, not state: the counts of the last second of a SIGKILLed worker are lost.

Fields of the hash (counts per bucket, not cumulative; bucket `len(bounds)` is above the last bound):
- `d|<outcome>|<task>|<bucket>` and `d|<outcome>|<task>|sum` (seconds): how long attempts ran,
  `<outcome>` being `success` or `failure`;
- `w|<task>|<bucket>` and `w|<task>|sum`: how long first attempts waited from when they were
  due (enqueued, or their process-at time) to their start.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..exceptions import BrokerUnavailable

#: Upper bounds (seconds) of the buckets of run times.
DURATION_BOUNDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
#: Upper bounds (seconds) of the buckets of waits.
WAIT_BOUNDS = (0.001, 0.0025, *DURATION_BOUNDS)


@dataclass
class Histogram:
    """One series: counts per bucket (not cumulative, the last one above the last bound), and the sum."""

    task: str
    bounds: tuple[float, ...]
    outcome: str | None = None  # run times only
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def cumulative(self) -> list[tuple[str, int]]:
        """(`le` label, count of observations up to it), as Prometheus exposes a histogram."""
        labels = [*(repr(bound) for bound in self.bounds), "+Inf"]
        total, buckets = 0, []
        for label, count in zip(labels, self.counts, strict=True):
            total += count
            buckets.append((label, total))
        return buckets


class Timings:
    """Counts of one worker, per queue, waiting to be added to Redis. Used by one thread.

    Counted by tuples, named as hash fields only when flushed: an observation is on the path of
    every task.
    """

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str, bool, int], int] = defaultdict(int)  # (queue, task, ok, bucket)
        self._run_sums: dict[tuple[str, str, bool], float] = defaultdict(float)
        self._waits: dict[tuple[str, str, int], int] = defaultdict(int)  # (queue, task, bucket)
        self._wait_sums: dict[tuple[str, str], float] = defaultdict(float)

    def __bool__(self) -> bool:
        """Whether there are counts to add."""
        return bool(self._run_sums or self._wait_sums)

    def observe(self, queue: str, task: str, *, ran: float, ok: bool, waited: float | None = None) -> None:
        self._runs[queue, task, ok, bisect_left(DURATION_BOUNDS, ran)] += 1
        self._run_sums[queue, task, ok] += ran
        if waited is not None:
            waited = max(0.0, waited)  # hosts' clocks may disagree a little
            self._waits[queue, task, bisect_left(WAIT_BOUNDS, waited)] += 1
            self._wait_sums[queue, task] += waited

    def flush(self, add: Callable[[dict[str, dict[str, float]]], None]) -> None:
        """Hand the counts, as hash fields by queue, to `add` (Broker.add_timings). If Redis is
        unreachable they are kept for the next flush; after any other error they are dropped."""
        if not self:
            return
        by_queue: dict[str, dict[str, float]] = defaultdict(dict)
        for (queue, task, ok, bucket), count in self._runs.items():
            by_queue[queue][f"d|{_OUTCOME[ok]}|{task}|{bucket}"] = count
        for (queue, task, ok), total in self._run_sums.items():
            by_queue[queue][f"d|{_OUTCOME[ok]}|{task}|sum"] = total
        for (queue, task, bucket), count in self._waits.items():
            by_queue[queue][f"w|{task}|{bucket}"] = count
        for (queue, task), total in self._wait_sums.items():
            by_queue[queue][f"w|{task}|sum"] = total
        try:
            add(by_queue)
        except BrokerUnavailable:
            raise  # nothing was added: the counts stay for the next flush
        except Exception:
            self._clear()  # part of the pipeline may have been applied: adding it again would count twice
            raise
        self._clear()

    def _clear(self) -> None:
        self._runs.clear()
        self._run_sums.clear()
        self._waits.clear()
        self._wait_sums.clear()


_OUTCOME = {True: "success", False: "failure"}


def histograms(raw: dict[str, str]) -> tuple[list[Histogram], list[Histogram]]:
    """Read a queue's timings hash: (run times by task and outcome, waits by task)."""
    ran: dict[tuple[str, str], Histogram] = {}
    waited: dict[str, Histogram] = {}
    for name, value in raw.items():
        kind, _, rest = name.partition("|")
        if kind == "d":
            outcome, _, rest = rest.partition("|")
            task, _, slot = rest.rpartition("|")
            histogram = ran.get((task, outcome))
            if histogram is None:
                histogram = ran[task, outcome] = Histogram(task=task, outcome=outcome, bounds=DURATION_BOUNDS)
        elif kind == "w":
            task, _, slot = rest.rpartition("|")
            histogram = waited.get(task)
            if histogram is None:
                histogram = waited[task] = Histogram(task=task, bounds=WAIT_BOUNDS)
        else:
            continue
        if slot == "sum":
            histogram.sum = float(value)
        elif slot.isdigit() and int(slot) < len(histogram.counts):
            histogram.counts[int(slot)] = int(float(value))
    by_task = sorted(ran.values(), key=lambda h: (h.task, h.outcome or ""))
    return by_task, sorted(waited.values(), key=lambda h: h.task)

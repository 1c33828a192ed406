"""The scheduler enqueues the tasks of periodic schedules, once per tick across all workers."""

from __future__ import annotations

from collections.abc import Sequence

from ..broker import Broker
from ..exceptions import BrokerUnavailable
from ..periodic import ScheduleEntry
from .component import Component

#: Seconds past a tick the scheduler wakes for it, as a sleep may end a little early.
TICK_SLACK = 0.002
#: Shortest sleep between passes, in seconds.
MIN_WAIT = 0.001


class Scheduler(Component):
    """Every worker runs one; for each schedule, each pass asks Redis to enqueue its latest tick.

    The `enqueue_periodic` script records each schedule's last tick and enqueues only a newer
    one, so one task is enqueued per tick however many workers ask, and a tick missed while no
    worker ran is caught up once: its latest tick only. Between passes the scheduler sleeps
    until the next tick of any schedule, `interval` seconds at most.
    """

    name = "scheduler"

    def __init__(self, *, broker: Broker, entries: Sequence[ScheduleEntry], interval: float) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.entries = list(entries)
        self.max_interval = interval
        self._dealt: dict[str, int] = {}  # schedule name -> latest tick known to be dealt with

    def run_once(self) -> int:
        """Deal with each schedule's latest tick; return how many tasks this pass enqueued."""
        enqueued = 0
        try:
            now = self.broker.clock()
            for entry in self.entries:
                tick = entry.latest_tick(now)
                if self._dealt.get(entry.name, -1) >= tick:
                    continue
                try:
                    outcome = self.broker.enqueue_periodic(
                        entry.message(tick), schedule=entry.name, tick_ms=tick
                    )
                except BrokerUnavailable:
                    raise
                except Exception:
                    self.logger.exception("could not enqueue periodic task %r", entry.name)
                    continue
                self._dealt[entry.name] = tick
                if outcome == "enqueued":
                    enqueued += 1
                    self.logger.debug("enqueued periodic task %r for tick %d", entry.name, tick)
                elif outcome in ("exists", "locked"):
                    self.logger.info(
                        "skipped periodic task %r for tick %d: its task is still live (%s)",
                        entry.name,
                        tick,
                        outcome,
                    )
        finally:
            # The Component loop sleeps `interval` between passes: wake at the next tick.
            self.interval = self.until_next_tick()
        return enqueued

    def until_next_tick(self) -> float:
        """Return the seconds to sleep before the next pass: until just past the next tick."""
        if not self.entries:
            return self.max_interval
        now = self.broker.clock()
        next_ms = min(entry.next_tick(now) for entry in self.entries)
        wait = next_ms / 1000 - now + TICK_SLACK
        return min(self.max_interval, max(MIN_WAIT, wait))

"""The healthchecker pings Redis and reports the worker's health: the one voice of an outage."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..broker import Broker
from ..exceptions import BrokerUnavailable
from .component import Component
from .redis_watch import RedisWatch

HealthCallback = Callable[[bool, Exception | None], None]

#: Seconds between two reminders that Redis is still unreachable.
OUTAGE_REMINDER_SECONDS = 60.0


class Healthchecker(Component):
    """The healthchecker pings Redis, logs changes of health and tells an optional callback.

    It alone logs an outage (when it starts, every OUTAGE_REMINDER_SECONDS while it lasts, and
    when it ends); the other components log the passes Redis made them skip at DEBUG only.
    After each ping Redis answered, its Redis watch (when it has one) looks for a restart that
    lost the data, and checks Redis's configuration.
    """

    name = "healthchecker"

    def __init__(
        self,
        *,
        broker: Broker,
        interval: float,
        callback: HealthCallback | None = None,
        watch: RedisWatch | None = None,
    ) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.callback = callback
        self.watch = watch
        self._watch_failing = False
        self.healthy: bool | None = None
        self._unreachable_since: float | None = None  # time.monotonic()
        self._reminded_at = 0.0

    def outage_seconds(self) -> float:
        """How long Redis has been unreachable, as last seen; 0 while it answers."""
        since = self._unreachable_since
        return 0.0 if since is None else time.monotonic() - since

    def run_once(self) -> bool:
        error: Exception | None = None
        try:
            self.broker.ping()
        except BrokerUnavailable as exc:
            error = exc
        healthy = error is None
        now = time.monotonic()
        if healthy:
            if self._unreachable_since is not None:
                self.logger.warning("Redis is reachable again, after %.0fs", now - self._unreachable_since)
            elif self.healthy is None:
                self.logger.info("Redis is reachable")
            self._unreachable_since = None
        elif self._unreachable_since is None:
            self._unreachable_since = self._reminded_at = now
            self.logger.error(
                "%s. The worker waits for it: tasks it holds keep running, and their outcomes are "
                "written once it is back.",
                str(error).rstrip("."),
            )
        elif now - self._reminded_at >= OUTAGE_REMINDER_SECONDS:
            self._reminded_at = now
            self.logger.error("Redis still unreachable after %.0fs: %s", now - self._unreachable_since, error)
        self.healthy = healthy
        if healthy and self.watch is not None:
            self._look()
        if self.callback is not None:
            self.callback(healthy, error)
        return healthy

    def _look(self) -> None:
        try:
            self.watch.look()
        except BrokerUnavailable:
            pass  # the next ping tells
        except Exception as exc:  # a refused INFO (a managed Redis): said once
            if not self._watch_failing:
                self.logger.warning("cannot look for restarts of Redis that lose its data: %s", exc)
            self._watch_failing = True
        else:
            self._watch_failing = False

"""The healthchecker pings Redis and reports the worker's health."""

from __future__ import annotations

from collections.abc import Callable

from ..broker import Broker
from ..exceptions import BrokerUnavailable
from .component import Component

HealthCallback = Callable[[bool, Exception | None], None]


class Healthchecker(Component):
    """The healthchecker pings Redis, logs changes of health and tells an optional callback."""

    name = "healthchecker"

    def __init__(self, *, broker: Broker, interval: float, callback: HealthCallback | None = None) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.callback = callback
        self.healthy: bool | None = None

    def run_once(self) -> bool:
        error: Exception | None = None
        try:
            self.broker.ping()
        except BrokerUnavailable as exc:
            error = exc
        healthy = error is None
        if healthy != self.healthy:
            if healthy:
                self.logger.info("Redis is reachable")
            else:
                self.logger.error("Redis is unreachable: %s", error)
        self.healthy = healthy
        if self.callback is not None:
            self.callback(healthy, error)
        return healthy

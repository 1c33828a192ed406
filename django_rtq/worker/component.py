"""The shape every periodic worker component shares: a thread calling `run_once()` on a timer."""

from __future__ import annotations

import logging
import threading

from ..exceptions import BrokerUnavailable

#: Longest wait (seconds) between passes of a component whose passes keep failing.
MAX_BACKOFF = 5.0


class Component:
    """Runs `run_once()` now and then every `interval` seconds, in a daemon thread, until stopped.

    A pass that fails is logged and the next one runs later, backing off while passes keep
    failing for another reason than Redis being away (up to `max_backoff` seconds, MAX_BACKOFF
    unless the component needs its passes more often): one bad pass must not stop the worker,
    nor flood its log. A pass Redis's absence made skip is logged at
    DEBUG: the healthchecker reports the outage itself.
    """

    name = "component"

    def __init__(self, *, interval: float, max_backoff: float = MAX_BACKOFF) -> None:
        self.interval = interval
        self.max_backoff = max_backoff
        self.logger = logging.getLogger(f"django_rtq.worker.{self.name}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"rtq-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def is_alive(self) -> bool:
        """Whether the component's thread runs (or it was never started, or was stopped)."""
        return self._thread is None or self._thread.is_alive()

    def _loop(self) -> None:
        failures = 0
        while True:
            try:
                self.run_once()
                failures = 0
            except BrokerUnavailable as exc:
                # No back-off of its own: the client already spent seconds retrying, and the
                # pass after Redis returns must come at once (leases to renew, results to write).
                self.logger.debug("%s pass skipped: %s", self.name, exc)
            except Exception:
                failures += 1
                self.logger.exception("%s pass failed", self.name)
            wait = (
                self.interval
                if failures < 2
                else min(self.max_backoff, max(self.interval, 0.5) * 2 ** (failures - 1))
            )
            if self._stop.wait(wait):
                return

"""The shape every periodic worker component shares: a thread calling `run_once()` on a timer."""

from __future__ import annotations

import logging
import threading

from ..exceptions import BrokerUnavailable


class Component:
    """Runs `run_once()` now and then every `interval` seconds, in a daemon thread, until stopped.

    A pass that fails is logged and the next one runs on time: one bad pass must not stop
    the worker.
    """

    name = "component"

    def __init__(self, *, interval: float) -> None:
        self.interval = interval
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

    def _loop(self) -> None:
        while True:
            try:
                self.run_once()
            except BrokerUnavailable as exc:
                self.logger.warning("%s pass skipped: %s", self.name, exc)
            except Exception:
                self.logger.exception("%s pass failed", self.name)
            if self._stop.wait(self.interval):
                return

"""The syncer keeps state changes that failed to reach Redis and retries them until they do."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..exceptions import BrokerUnavailable
from .component import Component


@dataclass(slots=True)
class SyncRequest:
    """A write to retry: `apply()` redoes it; past `deadline` (epoch seconds) it is dropped."""

    apply: Callable[[], object]
    description: str
    deadline: float


class Syncer(Component):
    """The syncer retries writes the processor could not make, until each succeeds or expires.

    A request past its deadline is dropped: by then the task's lease has expired and the
    recoverer owns the task, so nothing is lost.
    """

    name = "syncer"

    def __init__(self, *, interval: float, clock: Callable[[], float] = time.time) -> None:
        super().__init__(interval=interval)
        self.clock = clock
        self._requests: list[SyncRequest] = []
        self._lock = threading.Lock()

    def add(self, request: SyncRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def __len__(self) -> int:
        return len(self._requests)

    def run_once(self) -> int:
        with self._lock:
            requests, self._requests = self._requests, []
        failed = []
        now = self.clock()
        for request in requests:
            if request.deadline < now:
                self.logger.warning("dropped %s: its deadline passed", request.description)
                continue
            try:
                request.apply()
            except BrokerUnavailable:
                failed.append(request)
        with self._lock:
            self._requests[:0] = failed
        return len(requests) - len(failed)

    def stop(self, timeout: float | None = 5.0) -> None:
        super().stop(timeout)
        try:
            self.run_once()  # one last try before the process exits
        except Exception:
            self.logger.exception("final sync failed")

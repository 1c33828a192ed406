"""The syncer keeps state changes that failed to reach Redis and retries them until they do."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..exceptions import BrokerUnavailable
from .component import Component


def _nothing() -> None:
    pass


@dataclass(slots=True)
class SyncRequest:
    """A write to retry: `apply()` redoes it; `done()` follows once it was made (or dropped)."""

    apply: Callable[[], object]
    description: str
    done: Callable[[], object] = _nothing


class Syncer(Component):
    """The syncer retries writes the processor could not make, in order, until each succeeds.

    However long Redis is away, a result is written when it returns: the settling scripts are
    fenced by run, so a result applies unless another run of its task has started since (and
    the recoverer waits for live workers to write theirs before it takes tasks back). A write
    that fails for another reason than Redis being away is logged and dropped: its task is
    taken back once its lease expires.
    """

    name = "syncer"

    def __init__(self, *, interval: float) -> None:
        super().__init__(interval=interval)
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
        done = 0
        for i, request in enumerate(requests):
            try:
                request.apply()
            except BrokerUnavailable:
                with self._lock:  # still away: keep this one and the rest, in order
                    self._requests[:0] = requests[i:]
                break
            except Exception:
                self.logger.exception("dropped the %s: it failed", request.description)
            request.done()
            done += 1
        return done

    def stop(self, timeout: float | None = 5.0) -> None:
        super().stop(timeout)
        try:
            self.run_once()  # one last try before the process exits
        except Exception:
            self.logger.exception("final sync failed")
        if self._requests:
            self.logger.error(
                "%d write(s) could not reach Redis before the worker exited; their tasks will be "
                "taken back once their leases expire",
                len(self._requests),
            )

"""The commander applies workflow commands: a child's outcome to its workflow, a workflow's
next steps to their queues (see django_rtq/workflows/commands.py)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..broker import Broker
from ..exceptions import BrokerUnavailable
from ..workflows.commands import apply_due
from .component import Component


class Commander(Component):
    """Applies the commands of its queues (and those they lead to in other queues) every
    `interval` seconds, and at once when `wake()` says a task of its worker wrote one."""

    name = "commands"

    def __init__(self, *, broker: Broker, queues: Sequence[str], interval: float) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)
        self._wake = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def run_once(self) -> int:
        return apply_due(self.broker, self.queues)

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        super().stop(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_once()
            except BrokerUnavailable as exc:
                self.logger.warning("commands pass skipped: %s", exc)
            except Exception:
                self.logger.exception("commands pass failed")
            self._wake.wait(self.interval)

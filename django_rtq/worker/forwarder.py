"""The forwarder moves scheduled and retry tasks whose time has come to pending."""

from __future__ import annotations

from collections.abc import Sequence

from ..broker import Broker
from .component import Component


class Forwarder(Component):
    """The forwarder moves due scheduled and retry tasks of its queues to pending."""

    name = "forwarder"

    def __init__(self, *, broker: Broker, queues: Sequence[str], interval: float) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)

    def run_once(self) -> int:
        moved = 0
        for queue in self.queues:
            count = self.broker.forward(queue)
            if count:
                self.logger.debug("forwarded %d task(s) to pending in queue %r", count, queue)
            moved += count
        return moved

"""The heartbeater records the worker in the registry and extends the leases of its tasks."""

from __future__ import annotations

import time
from typing import Protocol

from ..broker import Broker
from ..exceptions import BrokerUnavailable
from .component import Component
from .neighbours import NeighbourWatch


class LeaseHolder(Protocol):
    def owned_by_queue(self) -> dict[str, list[tuple[str, bool]]]: ...
    def lease_extended(self, sent_at: float) -> None: ...
    def describe(self) -> dict: ...


class Heartbeater(Component):
    """The heartbeater extends the lease of every task the processor holds, claimed or running
    (recording the start of those that started since), and writes the worker's info (host,
    pid, queues, in-flight tasks, and its project when it has a neighbour watch) with a TTL,
    then lets the watch look for workers of another project."""

    name = "heartbeater"

    def __init__(
        self,
        *,
        broker: Broker,
        worker_id: str,
        processor: LeaseHolder,
        interval: float,
        neighbours: NeighbourWatch | None = None,
    ) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.worker_id = worker_id
        self.processor = processor
        self.neighbours = neighbours

    def run_once(self) -> int:
        sent_at = time.monotonic()
        extended = 0
        for queue, tasks in self.processor.owned_by_queue().items():
            extended += self.broker.extend_leases(queue, tasks, worker_id=self.worker_id)
        self.processor.lease_extended(sent_at)
        # A worker that missed three beats is taken for dead in the registry (its tasks' leases
        # run on their own clock).
        info = self.processor.describe()
        if self.neighbours is not None:
            info.update(self.neighbours.project.info())
        self.broker.write_worker(self.worker_id, info, ttl_seconds=3 * self.interval)
        if self.neighbours is not None:
            self._look_around(self.neighbours)
        return extended

    def _look_around(self, neighbours: NeighbourWatch) -> None:
        # Never a failed pass for this: the component would back off, and beats are leases.
        try:
            neighbours.look()
        except BrokerUnavailable as exc:
            self.logger.debug("could not look for workers of another project: %s", exc)
        except Exception:
            self.logger.exception("could not look for workers of another project")

    def stop(self, timeout: float | None = 5.0) -> None:
        super().stop(timeout)
        try:
            self.broker.remove_worker(self.worker_id)
        except Exception:
            self.logger.warning("could not remove worker %r from the registry", self.worker_id)

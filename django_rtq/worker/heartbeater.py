"""The heartbeater extends the leases of the worker's tasks and records the worker in the registry."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from ..broker import Broker
from ..exceptions import BrokerUnavailable
from .component import Component
from .neighbours import NeighbourWatch

#: Tries of the lease renewals within a lease budget at least, however often passes fail: the
#: heartbeater never waits longer than the budget's share between two (and never longer than
#: its interval when that is the longer).
RENEWALS_PER_BUDGET = 3


class LeaseHolder(Protocol):
    lease_budget: float

    def owned_by_queue(self) -> dict[str, list[tuple[str, bool]]]: ...
    def lease_extended(self, sent_at: float) -> None: ...
    def describe(self) -> dict: ...


class WriteFailures:
    """Logs each of the heartbeater's writes as it starts failing, fails another way, or works
    again: once per change, never once per beat."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._failing: dict[str, str] = {}  # write → the class of the error it last failed with

    def attempt(self, write: str, call: Callable[[], object], consequence: str) -> None:
        """Make a write, logging how it fails or that it works again, never raising."""
        try:
            call()
        except Exception as exc:
            self.failed(write, exc, consequence)
        else:
            self.worked(write)

    def failed(self, write: str, error: Exception, consequence: str) -> None:
        kind = type(error).__qualname__
        if self._failing.get(write) == kind:
            return
        self._failing[write] = kind
        self.logger.log(
            logging.WARNING if isinstance(error, BrokerUnavailable) else logging.ERROR,
            "could not %s (%s: %s); %s (logged again when this changes)",
            write,
            kind,
            error,
            consequence,
        )

    def worked(self, write: str) -> None:
        if self._failing.pop(write, None) is not None:
            self.logger.info("could %s again", write)


class Heartbeater(Component):
    """The heartbeater extends the lease of every task the processor holds, claimed or running
    (recording the start of those that started since), then, apart, writes the worker's info
    (host, pid, queues, in-flight tasks, and its project when it has a neighbour watch) with a
    TTL and its entry in the workers set, then lets the watch look for workers of another
    project.

    Renewals come first and nothing else of a beat stops them: a write of the registry that
    keeps failing (a key of the wrong type, a full Redis) is logged once and tried again at the
    next beat, while the leases are renewed. A pass whose renewals Redis's absence stopped is
    skipped, as every component's; the watchdog stops the handlers once the leases could not be
    renewed for the lease budget."""

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
        super().__init__(
            interval=interval, max_backoff=max(interval, processor.lease_budget / RENEWALS_PER_BUDGET)
        )
        self.broker = broker
        self.worker_id = worker_id
        self.processor = processor
        self.neighbours = neighbours
        self.failures = WriteFailures(self.logger)

    def run_once(self) -> int:
        extended = self._renew_leases()
        self.failures.attempt(
            f"record worker {self.worker_id!r} in the registry ({self.broker.keys.workers} and its info)",
            self._register,
            "its leases are renewed all the same",
        )
        if self.neighbours is not None:
            self.failures.attempt(
                "look for workers of another project", self.neighbours.look, "it looks again later"
            )
        return extended

    def _renew_leases(self) -> int:
        """Extend every lease the worker holds; tell the processor when all were. Redis's absence
        is raised (the pass is skipped); another error is logged, and the leases run on."""
        sent_at = time.monotonic()
        extended = 0
        renewed = True
        for queue, tasks in self.processor.owned_by_queue().items():
            write = f"renew the leases of queue {queue!r}"
            try:
                extended += self.broker.extend_leases(queue, tasks, worker_id=self.worker_id)
            except BrokerUnavailable:
                raise
            except Exception as exc:
                renewed = False
                self.failures.failed(write, exc, "the worker stops its tasks if this lasts")
            else:
                self.failures.worked(write)
        if renewed:
            self.processor.lease_extended(sent_at)
        return extended

    def _register(self) -> None:
        # A worker that missed three beats is taken for dead in the registry (its tasks' leases
        # run on their own clock).
        info = self.processor.describe()
        if self.neighbours is not None:
            info.update(self.neighbours.project.info())
        self.broker.write_worker(self.worker_id, info, ttl_seconds=3 * self.interval)

    def stop(self, timeout: float | None = 5.0) -> None:
        super().stop(timeout)
        try:
            self.broker.remove_worker(self.worker_id)
        except Exception:
            self.logger.warning("could not remove worker %r from the registry", self.worker_id)

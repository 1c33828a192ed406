"""The recoverer takes back the tasks of workers that died (their lease expired) and gives
them to other workers."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..broker import Broker
from ..broker.broker import BATCH_LIMIT
from ..exceptions import BrokerUnavailable
from .component import Component


class Recoverer(Component):
    """The recoverer finds tasks whose lease expired `grace` seconds ago and returns them to
    pending, uncounted: a crash is not the task's failure (recover.lua). A task that keeps
    killing its workers is archived once it has been recovered more than `max_recoveries` times.

    Leases are reckoned on the Redis server's clock, so the grace only covers the time a renewal
    takes to arrive. After this worker could not reach Redis, it waits `settle_seconds` of
    unbroken contact before taking anything back: every live worker renews its leases (and the
    syncer writes the results it kept) in that time, so an outage alone never takes a task
    from a worker that is still running it.
    """

    name = "recoverer"

    def __init__(
        self,
        *,
        broker: Broker,
        queues: Sequence[str],
        interval: float,
        grace: float,
        max_recoveries: int,
        settle_seconds: float,
    ) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)
        self.grace_ms = int(grace * 1000)
        self.max_recoveries = max_recoveries
        self.settle_seconds = settle_seconds
        self._in_contact_since: float | None = None  # time.monotonic() of the first pass that reached Redis

    def run_once(self) -> int:
        if self._in_contact_since is None:
            self.broker.ping()
            self._in_contact_since = time.monotonic()
        if time.monotonic() - self._in_contact_since < self.settle_seconds:
            return 0
        recovered = 0
        try:
            for queue in self.queues:
                recovered += self._recover_queue(queue)
        except BrokerUnavailable:
            self._in_contact_since = None
            raise
        return recovered

    def _recover_queue(self, queue: str) -> int:
        recovered = 0
        while True:
            try:
                outcomes = self.broker.recover(
                    queue, grace_ms=self.grace_ms, max_recoveries=self.max_recoveries, limit=BATCH_LIMIT
                )
            except BrokerUnavailable:
                raise
            except Exception:
                # One queue's bad data must not keep the others' tasks from being recovered.
                self.logger.exception("recovering tasks of queue %r failed", queue)
                return recovered
            for task_id, outcome in outcomes:
                log = self.logger.error if outcome == "archived" else self.logger.warning
                log(
                    "took back task %r of queue %r from a worker that died: %s",
                    task_id,
                    queue,
                    _DESCRIBED[outcome],
                )
            recovered += len(outcomes)
            if len(outcomes) < BATCH_LIMIT:
                return recovered


_DESCRIBED = {
    "requeued": "it had not started; back in pending",
    "recovered": "it had started; back in pending, no attempt charged",
    "archived": "archived as a poison pill (out of recoveries)",
}

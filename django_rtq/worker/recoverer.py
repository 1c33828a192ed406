"""The recoverer sends active tasks whose lease expired (their worker died) to retry or archive."""

from __future__ import annotations

from collections.abc import Sequence

from ..broker import Broker, ClaimedTask, TaskMessage
from ..broker.broker import BATCH_LIMIT
from ..exceptions import LeaseExpired
from .component import Component
from .outcome import Failure, settle_failure


class Recoverer(Component):
    """The recoverer finds tasks whose lease expired `grace` seconds ago and settles them as failed.

    The grace allows for clock skew between hosts: a lease is only taken from a worker
    that has missed renewing it for that long.
    """

    name = "recoverer"

    def __init__(self, *, broker: Broker, queues: Sequence[str], interval: float, grace: float) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)
        self.grace_ms = int(grace * 1000)

    def run_once(self) -> int:
        recovered = 0
        for queue in self.queues:
            while True:
                cutoff_ms = self.broker.now_ms() - self.grace_ms
                expired = self.broker.expired_leases(queue, cutoff_ms=cutoff_ms, limit=BATCH_LIMIT)
                moved = sum(self._recover(claimed, owner, cutoff_ms) for claimed, owner in expired)
                recovered += moved
                if len(expired) < BATCH_LIMIT or moved == 0:
                    break
        return recovered

    def _recover(self, claimed: ClaimedTask, owner: str | None, cutoff_ms: int) -> bool:
        try:
            message = TaskMessage.from_json(claimed.raw_message) if claimed.raw_message else None
        except ValueError:
            message = None
        error = LeaseExpired(f"the lease of worker {owner!r} expired")
        target = settle_failure(
            self.broker,
            Failure(claimed=claimed, message=message, error=error),
            worker_id=owner or "",
            lease_cutoff_ms=cutoff_ms,
        )
        if target is None:
            return False
        self.logger.warning(
            "recovered task %r (%s) in queue %r from worker %r: now %s",
            claimed.id,
            message.task if message else "?",
            claimed.queue,
            owner,
            target,
        )
        return True

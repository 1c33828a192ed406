"""The pruner deletes the ORM mirror's rows older than MIRROR_MAX_AGE, one worker at a time."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from django.db import DatabaseError, connections

from ..broker import Broker
from ..mirror import PRUNE_BATCH, prune
from .component import Component

#: Longest (seconds) one pass prunes, at most half the time between passes: a large backlog
#: (the setting lowered, or the workers stopped for weeks) is cut a pass at a time.
PASS_SECONDS = 60.0
#: Between two batches the pruner rests as long as the batch took, and at least this (seconds):
#: the database serves others at least half the time.
MIN_REST = 0.05


class Pruner(Component):
    """Deletes the mirrored rows that finished more than `max_age` seconds ago (on Redis's
    clock), at most once every `every` seconds across all workers: the worker that takes the
    turn (a key with a TTL of `every`) prunes, in batches of `batch_size` rows with a rest
    between them, for `every` / 2 seconds (and PASS_SECONDS) at most; the others wait for the
    turn to expire. A database that fails is logged, and the next turn tries again."""

    name = "pruner"

    def __init__(
        self,
        *,
        broker: Broker,
        worker_id: str,
        max_age: float,
        every: float,
        using: str = "default",
        batch_size: int = PRUNE_BATCH,
    ) -> None:
        super().__init__(interval=every)
        self.broker = broker
        self.worker_id = worker_id
        self.max_age = max_age
        self.every = every
        self.using = using
        self.batch_size = batch_size

    def run_once(self) -> int:
        """Prune if it is this worker's turn; return how many rows were deleted."""
        if not self.broker.take_prune_turn(self.worker_id, ttl_ms=int(self.every * 1000)):
            return 0
        cutoff = datetime.fromtimestamp(self.broker.clock() - self.max_age, UTC)
        deadline = time.monotonic() + min(PASS_SECONDS, self.every / 2)

        def rest(batch_seconds: float) -> bool:
            if time.monotonic() + batch_seconds >= deadline:
                return False
            return not self._stop.wait(max(MIN_REST, batch_seconds))

        connection = connections[self.using]
        connection.close_if_unusable_or_obsolete()
        try:
            deleted = prune(cutoff, using=self.using, limit=self.batch_size, rest=rest)
        except DatabaseError as exc:
            self.logger.warning(
                "could not prune the finished tasks' rows (%s); the next turn tries again", exc
            )
            connection.close()  # reconnect on the next pass
            return 0
        if deleted:
            self.logger.info("deleted %d finished task row(s) older than %s", deleted, cutoff.isoformat())
        return deleted

    def _loop(self) -> None:
        try:
            super()._loop()
        finally:
            connections[self.using].close()

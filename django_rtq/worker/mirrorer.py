"""The mirrorer writes finished tasks from Redis's buffer to the ORM, in batches."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from django.db import DatabaseError, connections

from ..broker import Broker
from ..exceptions import BrokerUnavailable
from ..mirror import mirror_batch
from ..tables import migrate_hint, missing_table
from .component import Component

#: Seconds a worker keeps a queue's mirror lock at least: another takes over if it dies.
MIN_LOCK_SECONDS = 10.0
#: While the worker's processor is busy, the share of the time the mirrorer writes: it yields
#: the interpreter to running tasks and catches up once they are done...
BUSY_SHARE = 0.05
#: ...unless the buffer grows: the share grows by BUSY_SHARE for each BACKLOG_STEP records
#: waiting, up to MAX_BUSY_SHARE, so that a worker busy for hours cannot fill Redis's memory.
BACKLOG_STEP = 50_000
MAX_BUSY_SHARE = 0.5
#: Seconds between two looks at whether the worker is still busy, while the mirrorer yields.
BUSY_POLL = 0.1


class Mirrorer(Component):
    """Mirrors each of its queues' finished tasks, one worker per queue at a time.

    While the database is unreachable the records wait in Redis and are written on a later
    pass; a record is dropped from the buffer only once its row is written. While `busy()`
    says the worker runs tasks, it writes at most a BUSY_SHARE of the time.
    """

    name = "mirror"

    def __init__(
        self,
        *,
        broker: Broker,
        worker_id: str,
        queues: Sequence[str],
        interval: float,
        batch_size: int,
        using: str = "default",
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(interval=interval)
        self.busy = busy
        self.broker = broker
        self.worker_id = worker_id
        self.queues = list(queues)
        self.batch_size = batch_size
        self.using = using
        self.lock_ms = int(max(MIN_LOCK_SECONDS, 3 * interval) * 1000)
        self._database_down = False

    def run_once(self, *, max_batches: int | None = None) -> int:
        """Mirror every queue's buffer (or up to `max_batches` per queue); return how many."""
        connection = connections[self.using]
        connection.close_if_unusable_or_obsolete()
        mirrored = 0
        try:
            for queue in self.queues:
                mirrored += self._mirror_queue(queue, max_batches)
        except DatabaseError as exc:
            if not self._database_down:
                table = missing_table(exc)
                if table is not None:
                    self.logger.error(
                        "cannot write finished tasks to the database: %s (%s); they wait in Redis",
                        migrate_hint(table, self.using),
                        exc,
                    )
                else:
                    self.logger.warning(
                        "cannot write finished tasks to the database (%s); they wait in Redis", exc
                    )
            self._database_down = True
            connection.close()  # reconnect on the next pass
            return mirrored
        if self._database_down:
            self.logger.warning("database reachable again; finished tasks are being mirrored")
            self._database_down = False
        return mirrored

    def _mirror_queue(self, queue: str, max_batches: int | None) -> int:
        mirrored, batches = 0, 0
        while max_batches is None or batches < max_batches:
            batches += 1
            started = time.monotonic()
            count = mirror_batch(
                self.broker,
                queue,
                worker_id=self.worker_id,
                limit=self.batch_size,
                lock_ms=self.lock_ms,
                using=self.using,
            )
            mirrored += count
            if count < self.batch_size or (max_batches is None and self._stop.is_set()):
                break
            if max_batches is None and self.busy():
                self._yield_to_tasks(queue, time.monotonic() - started)
        return mirrored

    def _yield_to_tasks(self, queue: str, batch_seconds: float) -> None:
        """Wait long enough that a batch of `batch_seconds` is the busy share of the time, or
        until the worker is idle again."""
        share = busy_share(self.broker.finished_backlog(queue))
        deadline = time.monotonic() + batch_seconds * (1 - share) / share
        while self.busy() and not self._stop.wait(min(BUSY_POLL, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                break

    def _loop(self) -> None:
        super()._loop()
        self._finish()

    def _finish(self) -> None:
        """On stop, in this component's thread: a last batch per queue for what the processor
        finished meanwhile, then hand the queues to another worker and close the connection."""
        try:
            self.run_once(max_batches=1)
            for queue in self.queues:
                self.broker.ack_finished(queue, [], worker_id=self.worker_id, release=True)
        except BrokerUnavailable as exc:
            self.logger.warning("could not finish mirroring: %s", exc)
        except Exception:
            self.logger.exception("could not finish mirroring")
        finally:
            connections[self.using].close()


def busy_share(backlog: int) -> float:
    """The share of the time to mirror while the worker runs tasks, with `backlog` records waiting."""
    return min(MAX_BUSY_SHARE, BUSY_SHARE * max(1.0, backlog / BACKLOG_STEP))

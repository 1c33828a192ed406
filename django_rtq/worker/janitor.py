"""The janitor deletes completed tasks past their retention, keeps the archive bounded,
archives tasks that waited too long for a worker able to run them, and forgets queues nothing uses."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..broker import Broker, forgetting, manual
from ..broker.attempt import error_path
from ..broker.waiting import parked_ids, parked_kinds
from ..exceptions import NoWorkerCanRun
from ..message_builder import note_signature, take_unannounced
from ..queue_names import named_queues
from ..registry import registered_tasks
from .component import Component

#: Tasks of one kind the janitor archives in a pass, at most.
ARCHIVE_BATCH = 500
#: Seconds between two of a janitor's looks for queues to forget (or a quarter of the grace,
#: if that is shorter): each look runs a script per queue named nowhere.
FORGET_EVERY = 60.0


class Janitor(Component):
    """The janitor deletes expired completed tasks and trims each archive by age and size; it
    archives the parked tasks of kinds no worker took for `no_worker_grace` seconds; and it
    forgets the queues that the project names nowhere, no live worker serves and nothing used
    for `forget_queues_after` seconds (None: never), looking again at those it forgot lately."""

    name = "janitor"

    def __init__(
        self,
        *,
        broker: Broker,
        queues: Sequence[str],
        interval: float,
        archive_max_age: float,
        archive_max_size: int,
        no_worker_grace: float = 24 * 3600.0,
        forget_queues_after: float | None = None,
    ) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)
        self.archive_max_age_ms = int(archive_max_age * 1000)
        self.archive_max_size = archive_max_size
        self.no_worker_grace = no_worker_grace
        self.forget_queues_after = forget_queues_after
        self.forget_every = min(FORGET_EVERY, (forget_queues_after or FORGET_EVERY) / 4)
        self._next_forget = 0.0  # time.monotonic() of the next look

    def run_once(self) -> int:
        self.announce_signatures()
        deleted = 0
        for queue in self.queues:
            count = self.broker.trim(
                queue,
                archive_max_age_ms=self.archive_max_age_ms,
                archive_max_size=self.archive_max_size,
            )
            if count:
                self.logger.debug("deleted %d expired task(s) in queue %r", count, queue)
            deleted += count
            self.archive_waited(queue)
        if time.monotonic() >= self._next_forget:
            self._next_forget = time.monotonic() + self.forget_every
            self.forget_unused_queues()
        return deleted

    def announce_signatures(self) -> None:
        """Tell the handler signatures of this worker's task types (each hour at most; a worker
        of another release that cannot bind a task's arguments then waits for this one), and
        forget those nobody told for the grace."""
        for task_type in registered_tasks().values():
            note_signature(task_type)
        self.broker.announce_signatures(take_unannounced())
        self.broker.forget_signatures(seen_before_ms=self.broker.now_ms() - int(self.no_worker_grace * 1000))

    def archive_waited(self, queue: str) -> int:
        """Tidy the parked index, and archive the parked tasks of kinds no worker took for the
        grace, saying so. Return how many were archived."""
        self.broker.forget_parked(queue)
        kinds = parked_kinds(self.broker, queue)
        if not kinds:
            return 0
        due_ms = self.broker.now_ms() - self.no_worker_grace * 1000
        archived = 0
        for kind, facts in kinds.items():
            since = facts.get("since")
            if not isinstance(since, int | float) or since > due_ms:
                continue
            ids = parked_ids(self.broker, queue, kind, ARCHIVE_BATCH)
            reason = (
                f"no worker could run it for {self.no_worker_grace / 3600:g} h: {facts.get('reason', '')}"
            )
            count = manual.archive(
                self.broker, queue, ids, reason=reason, error_type=error_path(NoWorkerCanRun)
            )
            if count:
                self.logger.warning("archived %d task(s) of queue %r: %s", count, queue, reason)
            archived += count
        if archived:
            self.broker.forget_parked(queue)
        return archived

    def forget_unused_queues(self) -> list[str]:
        """Put back the queues forgotten lately that a task came to, then forget the registered
        queues the project names nowhere (queue_names.py), no live worker serves and nothing
        used for the grace. Return the queues forgotten."""
        back = forgetting.look_again(self.broker)
        if back:
            self.logger.info("queue(s) %s in use again: listed again", ", ".join(map(repr, back)))
        if self.forget_queues_after is None:
            return []
        kept = set(named_queues())
        for info in self.broker.workers():
            kept.update(info.get("queues") or ())
        candidates = [queue for queue in self.broker.known_queues() if queue not in kept]
        forgotten = forgetting.forget_unused(
            self.broker, candidates, grace_ms=int(self.forget_queues_after * 1000)
        )
        for queue in forgotten:
            self.logger.info(
                "forgot queue %r: named nowhere in the project and unused for %gs",
                queue,
                self.forget_queues_after,
            )
        return forgotten

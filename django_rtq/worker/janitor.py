"""The janitor deletes completed tasks past their retention and keeps the archive bounded."""

from __future__ import annotations

from collections.abc import Sequence

from ..broker import Broker
from .component import Component


class Janitor(Component):
    """The janitor deletes expired completed tasks and trims each archive by age and size."""

    name = "janitor"

    def __init__(
        self,
        *,
        broker: Broker,
        queues: Sequence[str],
        interval: float,
        archive_max_age: float,
        archive_max_size: int,
    ) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)
        self.archive_max_age_ms = int(archive_max_age * 1000)
        self.archive_max_size = archive_max_size

    def run_once(self) -> int:
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
        return deleted

"""The bulk runner carries on actions on whole states (broker/bulk.py) that a request started."""

from __future__ import annotations

from collections.abc import Sequence

from ..broker import Broker, bulk
from .component import Component


class BulkRunner(Component):
    """Works on the unfinished bulk jobs of the worker's queues, `budget` seconds each per pass,
    and forgets finished ones after an hour. Several workers share a job safely: one holds its
    lock at a time."""

    name = "bulk"

    def __init__(self, *, broker: Broker, queues: Sequence[str], interval: float, budget: float) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)
        self.budget = budget

    def run_once(self) -> int:
        worked = 0
        for queue in self.queues:
            for job in bulk.jobs(self.broker, queue):
                if not job.finished:
                    bulk.carry_on(self.broker, queue, job.id, budget=self.budget)
                    worked += 1
            bulk.forget_finished(self.broker, queue)
        return worked

"""`manage.py rtq_archive`: archive pending, scheduled or retry tasks, by id or a whole state."""

from __future__ import annotations

from django_rtq.broker import TaskState
from django_rtq.management.base import TaskActionCommand


class Command(TaskActionCommand):
    help = "Archive pending, scheduled or retry tasks, by id or a whole state of a queue."

    action = "archive"
    done = "archived"
    can_be = "can be archived"
    allowed = (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY)

    def act(self, queue: str, task_ids: list[str]) -> int:
        return self.inspector.archive(queue, task_ids)

    def act_all(self, queue: str, state: TaskState) -> int:
        return self.inspector.archive_all(queue, state)

"""`manage.py rtq_run`: run scheduled, retry or archived tasks now (move them to pending)."""

from __future__ import annotations

from django_rtq.broker import TaskState
from django_rtq.management.base import TaskActionCommand


class Command(TaskActionCommand):
    help = "Run tasks now: move scheduled, retry or archived tasks to pending, by id or a whole state."

    action = "run"
    done = "moved to pending"
    can_be = "can be run now"
    allowed = (TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED)

    def act(self, queue: str, task_ids: list[str]) -> int:
        return self.inspector.run_now(queue, task_ids)

    def act_all(self, queue: str, state: TaskState) -> int:
        return self.inspector.run_all(queue, state)

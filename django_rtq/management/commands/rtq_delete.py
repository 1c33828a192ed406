"""`manage.py rtq_delete`: delete tasks in any state but active, by id or a whole state."""

from __future__ import annotations

from django_rtq.broker import TaskState
from django_rtq.management.base import TaskActionCommand


class Command(TaskActionCommand):
    help = "Delete tasks in any state but active, by id or a whole state of a queue."

    action = "delete"
    done = "deleted"
    can_be = "can be deleted (cancel active ones with rtq_cancel)"
    allowed = tuple(state for state in TaskState if state != TaskState.ACTIVE)

    def act(self, queue: str, task_ids: list[str]) -> int:
        return self.inspector.delete(queue, task_ids)

    def act_all(self, queue: str, state: TaskState) -> int:
        return self.inspector.delete_all(queue, state)

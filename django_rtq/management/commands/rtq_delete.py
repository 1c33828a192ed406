"""`manage.py rtq_delete`: delete tasks, by id or a whole state."""

from __future__ import annotations

from django_rtq.broker.states import ACTION_STATES, Action
from django_rtq.management.base import TaskActionCommand


class Command(TaskActionCommand):
    help = (
        "Delete tasks, by id or a whole state of a queue. Applies to "
        f"{', '.join(ACTION_STATES[Action.DELETE])} tasks."
    )

    action = Action.DELETE

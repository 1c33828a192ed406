"""`manage.py rtq_run`: run tasks now (move them to pending), by id or a whole state."""

from __future__ import annotations

from django_rtq.broker.states import ACTION_STATES, Action
from django_rtq.management.base import TaskActionCommand


class Command(TaskActionCommand):
    help = (
        "Run tasks now: move them to pending, by id or a whole state of a queue. Applies to "
        f"{', '.join(ACTION_STATES[Action.RUN])} tasks."
    )

    action = Action.RUN

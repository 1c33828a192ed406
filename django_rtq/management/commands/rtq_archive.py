"""`manage.py rtq_archive`: archive tasks (they will not run), by id or a whole state."""

from __future__ import annotations

from django_rtq.broker.states import ACTION_STATES, Action
from django_rtq.management.base import TaskActionCommand


class Command(TaskActionCommand):
    help = (
        "Archive tasks so that they do not run, by id or a whole state of a queue. Applies to "
        f"{', '.join(ACTION_STATES[Action.ARCHIVE])} tasks."
    )

    action = Action.ARCHIVE

"""`manage.py rtq_run`: run tasks now (move them to pending), by id or a whole state."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from django_rtq.broker.states import ACTION_STATES, Action
from django_rtq.management.base import TaskActionCommand


class Command(TaskActionCommand):
    help = (
        "Run tasks now: move them to pending, by id or a whole state of a queue. Applies to "
        f"{', '.join(ACTION_STATES[Action.RUN])} tasks."
    )

    action = Action.RUN

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--task", dest="task_name", metavar="NAME", help="With --all: only the tasks of this task type."
        )
        parser.add_argument(
            "--error-class",
            metavar="CLASS",
            help="With --all: only the tasks whose last error is of this class (builtins.KeyError).",
        )

    def narrowing(self, options: dict[str, Any]) -> dict[str, str]:
        return {name: options[name] for name in ("task_name", "error_class") if options.get(name)}

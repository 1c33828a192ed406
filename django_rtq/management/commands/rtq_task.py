"""`manage.py rtq_task ID`: everything about one task, from its message to its last error."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from django_rtq.broker.inspect import TaskInfo
from django_rtq.broker.message import OPTION_FIELDS
from django_rtq.management.base import STATE_TIME_KEYS, STATE_TIME_LABELS, OperationsCommand, task_as_dict
from django_rtq.management.table import format_relative, format_time, render_fields

#: Message options and info entries holding epoch seconds, and those holding lengths of time.
TIME_FIELDS = ("deadline", "enqueued_at", "process_at")
SECONDS_FIELDS = ("timeout", "retention", "unique_ttl")
#: Info entries shown on their own rather than in the list of attempt facts.
INFO_SHOWN_APART = ("retried", "error", "error_type", "traceback")


class Command(OperationsCommand):
    help = "Show one task: arguments, options, attempts, last error and traceback, result."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("task_id", metavar="ID", help="The task's id.")
        parser.add_argument("--queue", "-q", help="The task's queue (without it, every queue is searched).")

    def run(self, *, task_id: str, queue: str | None, **options: Any) -> None:
        [task] = self.find_tasks([task_id], queue)
        if self.as_json:
            self.write_json(task_as_dict(task))
            return
        label = self.style.SQL_FIELD
        self.stdout.write(self.heading(f"Task {task.id}"))
        self.write_lines(render_fields(self.summary(task), label_style=label))
        if task.message is not None:
            self.stdout.write("\n" + self.heading("Options"))
            self.write_lines(render_fields(self.options(task), label_style=label))
        attempt_facts = [(key, value) for key, value in task.info.items() if key not in INFO_SHOWN_APART]
        if attempt_facts:
            self.stdout.write("\n" + self.heading("Attempts"))
            facts = [
                (key, format_time(value) if is_time(key, value) else value) for key, value in attempt_facts
            ]
            self.write_lines(render_fields(facts, label_style=label))
        traceback = task.info.get("traceback")
        if traceback:
            self.stdout.write("\n" + self.heading("Traceback"))
            self.write_lines("  " + line for line in traceback.rstrip().splitlines())

    def summary(self, task: TaskInfo) -> list[tuple[str, object]]:
        message = task.message
        pairs: list[tuple[str, object]] = [("queue", task.queue), ("state", task.state)]
        if message is None:
            pairs.append(("message", f"(corrupt) {task.raw_message}"))
        else:
            pairs += [
                ("task", message.task),
                ("args", json.dumps(message.args)),
                ("kwargs", json.dumps(message.kwargs)),
            ]
        time_key = STATE_TIME_KEYS.get(task.state)
        if time_key:
            pairs.append((STATE_TIME_LABELS[time_key], format_relative(task.score_at, self.now())))
        if task.owner:
            pairs.append(("worker", task.owner))
        pairs.append(("retried", task.retried))
        if task.last_error is not None:
            error_type = task.info.get("error_type")
            pairs.append(
                ("last error", f"{error_type}: {task.last_error}" if error_type else task.last_error)
            )
        if task.result is not None:
            pairs.append(("result", json.dumps(task.result)))
        return pairs

    def options(self, task: TaskInfo) -> list[tuple[str, object]]:
        pairs: list[tuple[str, object]] = []
        for name in OPTION_FIELDS:
            value = getattr(task.message, name)
            if name in TIME_FIELDS:
                value = format_time(value)
            elif name in SECONDS_FIELDS and value is not None:
                value = f"{value:g}s"
            pairs.append((name, value))
        return pairs


def is_time(key: str, value: object) -> bool:
    return key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool)

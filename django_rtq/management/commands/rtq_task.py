"""`manage.py rtq_task ID`: everything about one task, from its message to its last error."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from django_rtq.broker.message import OPTION_FIELDS
from django_rtq.management.base import STATE_TIME_KEYS, STATE_TIME_LABELS, OperationsCommand, task_as_dict
from django_rtq.management.table import format_relative, format_time, render_fields
from django_rtq.task_view import TaskView, view_of_live_task

#: Message options and info entries holding epoch seconds, and those holding lengths of time.
TIME_FIELDS = ("deadline", "enqueued_at", "process_at")
SECONDS_FIELDS = ("timeout", "retention", "unique_ttl", "debounce")
#: Info entries shown on their own rather than in the list of attempt facts.
INFO_SHOWN_APART = ("retried", "error", "error_type", "traceback", "errors")
#: How far the lines of an error's traceback are indented under its first line.
TRACEBACK_INDENT = "    "


class Command(OperationsCommand):
    help = "Show one task: arguments, options, attempts and their errors with tracebacks, result."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("task_id", metavar="ID", help="The task's id.")
        parser.add_argument("--queue", "-q", help="The task's queue (without it, every queue is searched).")

    def run(self, *, task_id: str, queue: str | None, **options: Any) -> None:
        [found] = self.find_tasks([task_id], queue)
        task = view_of_live_task(found, self.ops.held_reason(found))
        if self.as_json:
            self.write_json({**task_as_dict(task), "held_back": task.held_back})
            return
        label = self.style.SQL_FIELD
        self.stdout.write(self.heading(f"Task {task.id}"))
        self.write_lines(render_fields(self.summary(task), label_style=label))
        if task.held_back:
            self.stdout.write(task.held_back)
        if task.message is not None:
            self.stdout.write("\n" + self.heading("Options"))
            self.write_lines(render_fields(self.options(task), label_style=label))
        attempt_facts = [
            (key, value) for key, value in task.attempt.as_dict().items() if key not in INFO_SHOWN_APART
        ]
        if attempt_facts:
            self.stdout.write("\n" + self.heading("Attempts"))
            facts = [(key, fact_text(key, value)) for key, value in attempt_facts]
            self.write_lines(render_fields(facts, label_style=label))
        errors = task.attempt.error_records
        if errors:
            self.stdout.write("\n" + self.heading("Errors, oldest first"))
            for number, error in enumerate(errors):
                if number:
                    self.stdout.write("")
                self.write_lines(error_lines(error))
        traceback = task.traceback
        # The latest traceback normally ends `errors`: shown apart only when it does not (no `errors`).
        if traceback and traceback != (errors[-1].get("traceback") if errors else None):
            self.stdout.write("\n" + self.heading("Traceback"))
            self.write_lines(indented(traceback, "  "))

    def summary(self, task: TaskView) -> list[tuple[str, object]]:
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
        if task.error is not None:
            error_type = task.error_type
            pairs.append(("last error", f"{error_type}: {task.error}" if error_type else task.error))
        if task.result is not None:
            pairs.append(("result", json.dumps(task.result)))
        return pairs

    def options(self, task: TaskView) -> list[tuple[str, object]]:
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


def fact_text(key: str, value: object) -> object:
    """An attempt fact for display: times as dates, lists of names joined, other lists and objects
    as JSON (never a Python repr)."""
    if is_time(key, value):
        return format_time(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ", ".join(value) or None
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return value


def error_lines(error: dict[str, Any]) -> list[str]:
    """One recorded error: `type: message`, then its traceback as it was written, indented."""
    error_type, message = error.get("type") or "", str(error.get("message") or "")
    heading = f"{error_type}: {message}" if error_type else message
    lines = [f"  {line}" for line in heading.splitlines() or [""]]
    traceback = error.get("traceback")
    if isinstance(traceback, str) and traceback.strip():
        lines += indented(traceback, "  " + TRACEBACK_INDENT)
    return lines


def indented(text: str, indent: str) -> list[str]:
    return [indent + line for line in text.rstrip().splitlines()]

"""What the inspecting commands share: --json, error messages, queue and state checks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rtq import get_inspector
from django_rtq.broker import TaskMessage, TaskState
from django_rtq.broker.inspect import Inspector, TaskInfo
from django_rtq.conf import get_settings
from django_rtq.exceptions import BrokerUnavailable, RTQError, TaskNotFound

#: What the time kept with a task means in each state (the score of its sorted set).
STATE_TIME_KEYS = {
    TaskState.SCHEDULED: "next_run_at",
    TaskState.RETRY: "next_run_at",
    TaskState.ACTIVE: "lease_expires_at",
    TaskState.ARCHIVED: "archived_at",
    TaskState.COMPLETED: "expires_at",
}
STATE_TIME_LABELS = {
    "next_run_at": "next run",
    "lease_expires_at": "lease expires",
    "archived_at": "archived at",
    "expires_at": "expires",
}
OPTION_FIELDS = tuple(
    f.name for f in fields(TaskMessage) if f.name not in ("id", "task", "queue", "args", "kwargs")
)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def task_as_dict(task: TaskInfo) -> dict[str, Any]:
    """Everything known about a task, as JSON-ready data (times in epoch seconds)."""
    message = task.message
    data: dict[str, Any] = {
        "id": task.id,
        "queue": task.queue,
        "state": str(task.state),
        "task": message.task if message else None,
        "args": message.args if message else None,
        "kwargs": message.kwargs if message else None,
        "options": {name: getattr(message, name) for name in OPTION_FIELDS} if message else None,
        "retried": task.retried,
        "last_error": task.last_error,
        "error_type": task.info.get("error_type"),
        "traceback": task.info.get("traceback") or None,
        "info": task.info,
        "result": task.result,
        "worker": task.owner,
    }
    time_key = STATE_TIME_KEYS.get(task.state)
    if time_key:
        data[time_key] = task.score_at
    if message is None:
        data["raw_message"] = task.raw_message  # kept so a corrupt message can be looked at
    return data


class InspectorCommand(BaseCommand):
    """A command over the inspector, with --json and django-rtq errors turned into CommandError."""

    inspector: Inspector
    as_json: bool

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="Print JSON (and nothing else) instead of a table."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = options["json"]
        self.inspector = get_inspector()
        try:
            self.run(**options)
        except BrokerUnavailable as exc:
            raise CommandError(f"Cannot reach Redis: {exc}") from None
        except RTQError as exc:
            raise CommandError(str(exc)) from None

    def run(self, **options: Any) -> None:
        raise NotImplementedError

    # Output

    def write_json(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.stdout.write(line)

    def heading(self, text: str) -> str:
        return self.style.MIGRATE_HEADING(text)

    # Checking arguments

    def queue_names(self) -> list[str]:
        """Queues enqueued to at least once, and those in settings.RTQ['QUEUES']."""
        return sorted(set(self.inspector.queues()) | set(get_settings().QUEUES))

    def check_queues(self, names: Sequence[str]) -> list[str]:
        known = self.queue_names()
        for name in names:
            if name not in known:
                listed = ", ".join(known) or "none yet"
                raise CommandError(f"Unknown queue {name!r}. Known queues: {listed}.")
        return list(dict.fromkeys(names))

    def check_state(self, value: str) -> TaskState:
        try:
            return TaskState(value.lower())
        except ValueError:
            raise CommandError(f"Unknown state {value!r}. States: {', '.join(TaskState)}.") from None

    def find_tasks(self, task_ids: Sequence[str], queue: str | None) -> list[TaskInfo]:
        """Look every id up (in `queue`, or in every queue); fail naming the unknown ones."""
        if queue:
            self.check_queues([queue])
        found, missing = [], []
        for task_id in dict.fromkeys(task_ids):
            try:
                found.append(self.inspector.get_task(task_id, queue=queue))
            except TaskNotFound:
                missing.append(task_id)
        if missing:
            where = f" in queue {queue!r}" if queue else ""
            raise CommandError(
                f"Unknown task id{'s' if len(missing) > 1 else ''}{where}: {', '.join(missing)}."
            )
        return found


class TaskActionCommand(InspectorCommand):
    """rtq_run, rtq_archive and rtq_delete: act on tasks by id, or on a whole state of a queue."""

    action: str  # the command's verb: run, archive, delete
    done: str  # what happened to the tasks: "moved to pending", "archived", "deleted"
    can_be: str  # "can be run", to say which states the action applies to
    allowed: tuple[TaskState, ...]

    def act(self, queue: str, task_ids: list[str]) -> int:
        raise NotImplementedError

    def act_all(self, queue: str, state: TaskState) -> int:
        raise NotImplementedError

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("task_ids", nargs="*", metavar="ID", help="Ids of the tasks.")
        parser.add_argument("--queue", "-q", help="The tasks' queue (without it, each id is looked up).")
        parser.add_argument(
            "--all",
            metavar="STATE",
            dest="all_state",
            help=f"Every task of --queue in STATE ({', '.join(self.allowed)}), in batches.",
        )

    def run(self, *, task_ids: list[str], queue: str | None, all_state: str | None, **options: Any) -> None:
        if all_state is not None:
            self.run_bulk(task_ids, queue, all_state)
        else:
            self.run_by_id(task_ids, queue)

    def run_bulk(self, task_ids: list[str], queue: str | None, all_state: str) -> None:
        if task_ids:
            raise CommandError("Give task ids or --all STATE, not both.")
        if not queue:
            raise CommandError("--all needs --queue.")
        self.check_queues([queue])
        state = self.check_state(all_state)
        if state not in self.allowed:
            raise CommandError(
                f"rtq_{self.action} --all applies to {', '.join(self.allowed)} tasks, not {state}."
            )
        count = self.act_all(queue, state)
        if self.as_json:
            self.write_json({"action": self.action, "queue": queue, "state": state, "count": count})
        else:
            self.stdout.write(
                self.style.SUCCESS(f"{plural(count, f'{state} task')} of queue {queue!r} {self.done}.")
            )

    def run_by_id(self, task_ids: list[str], queue: str | None) -> None:
        if not task_ids:
            raise CommandError("Give task ids, or --queue QUEUE --all STATE.")
        tasks = self.find_tasks(task_ids, queue)
        eligible = [task for task in tasks if task.state in self.allowed]
        skipped = [task for task in tasks if task.state not in self.allowed]
        by_queue: dict[str, list[str]] = {}
        for task in eligible:
            by_queue.setdefault(task.queue, []).append(task.id)
        count = sum(self.act(name, ids) for name, ids in by_queue.items())
        if self.as_json:
            self.write_json(
                {
                    "action": self.action,
                    "count": count,
                    "ids": [task.id for task in eligible],
                    "skipped": [{"id": t.id, "queue": t.queue, "state": str(t.state)} for t in skipped],
                }
            )
        else:
            self.stdout.write(self.style.SUCCESS(f"{plural(count, 'task')} {self.done}."))
            for task in skipped:
                self.stdout.write(
                    self.style.WARNING(
                        f"Skipped {task.id} (queue {task.queue!r}): it is {task.state}; only "
                        f"{', '.join(self.allowed)} tasks {self.can_be}."
                    )
                )
        if skipped:
            raise CommandError(f"{plural(len(skipped), 'task')} skipped: not in a state that allows it.")


class QueueSwitchCommand(InspectorCommand):
    """rtq_pause and rtq_resume."""

    pause: bool

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="Queues to change.")

    def run(self, *, queues: list[str], **options: Any) -> None:
        word = "paused" if self.pause else "resumed"
        changes = []
        for queue in self.check_queues(queues):
            changed = self.inspector.broker.is_paused(queue) != self.pause
            if changed and self.pause:
                self.inspector.pause(queue)
            elif changed:
                self.inspector.resume(queue)
            changes.append({"queue": queue, "paused": self.pause, "changed": changed})
        if self.as_json:
            self.write_json({"queues": changes})
            return
        for change in changes:
            if change["changed"]:
                self.stdout.write(self.style.SUCCESS(f"Queue {change['queue']!r} {word}."))
            else:
                self.stdout.write(
                    f"Queue {change['queue']!r} was already {'paused' if self.pause else 'running'}."
                )

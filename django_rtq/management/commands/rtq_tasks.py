"""`manage.py rtq_tasks QUEUE STATE`: list a queue's tasks in one state, a page at a time."""

from __future__ import annotations

import math
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rtq.broker.states import TaskState
from django_rtq.formats import plural
from django_rtq.management.base import STATE_TIME_KEYS, STATE_TIME_LABELS, OperationsCommand, task_as_dict
from django_rtq.management.table import format_relative, render_table, shorten
from django_rtq.task_view import TaskView, view_of_live_task

MAX_PAGE_SIZE = 1000


class Command(OperationsCommand):
    help = (
        "List the tasks of a queue in one state: pending in the order they will run, scheduled "
        "and retry by due time, archived and completed newest first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("queue", help="The queue.")
        parser.add_argument("state", help=f"The state: {', '.join(TaskState)}.")
        parser.add_argument("--page", type=int, default=1, help="Page number, from 1 (default 1).")
        parser.add_argument("--page-size", type=int, default=20, help="Tasks per page (default 20).")

    def run(self, *, queue: str, state: str, page: int, page_size: int, **options: Any) -> None:
        self.check_queues([queue])
        task_state = self.check_state(state)
        if page < 1:
            raise CommandError("--page must be at least 1.")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise CommandError(f"--page-size must be between 1 and {MAX_PAGE_SIZE}.")
        total = self.ops.count(queue, task_state)
        tasks = [
            view_of_live_task(task)
            for task in self.ops.list_tasks(queue, task_state, offset=(page - 1) * page_size, limit=page_size)
        ]
        pages = math.ceil(total / page_size)
        if self.as_json:
            self.write_json(
                {
                    "queue": queue,
                    "state": task_state,
                    "page": page,
                    "page_size": page_size,
                    "pages": pages,
                    "total": total,
                    "tasks": [task_as_dict(task) for task in tasks],
                }
            )
            return
        if not tasks:
            where = f"on page {page} (of {pages}) " if total else ""
            self.stdout.write(f"No {task_state} tasks {where}in queue {queue!r}.")
            return
        self.write_lines(self.table(task_state, tasks))
        self.stdout.write("")
        self.stdout.write(f"Page {page} of {pages} ({plural(total, f'{task_state} task')}).")

    def table(self, state: TaskState, tasks: list[TaskView]) -> list[str]:
        headers = ["ID", "TASK", "STATE", "RETRIED", "LAST ERROR"]
        time_key = STATE_TIME_KEYS.get(state)
        if time_key:
            headers.append(STATE_TIME_LABELS[time_key].upper())
        if state == TaskState.ACTIVE:
            headers.append("WORKER")
        now = self.now()
        rows = []
        for task in tasks:
            row: list[object] = [
                task.id,
                task.task or "(corrupt message)",
                task.state,
                task.retried,
                shorten(task.error),
            ]
            if time_key:
                row.append(format_relative(task.score_at, now))
            if state == TaskState.ACTIVE:
                row.append(task.owner)
            rows.append(row)
        return render_table(headers, rows, header_style=self.heading)

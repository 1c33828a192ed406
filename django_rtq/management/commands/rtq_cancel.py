"""`manage.py rtq_cancel ID [ID ...]`: ask the workers running active tasks to stop them."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rtq.broker import TaskState
from django_rtq.broker.inspect import TaskInfo
from django_rtq.management.base import InspectorCommand, plural


class Command(InspectorCommand):
    help = "Cancel active tasks: the worker running each one interrupts it and archives it."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("task_ids", nargs="+", metavar="ID", help="Ids of active tasks.")
        parser.add_argument("--queue", "-q", help="The tasks' queue (without it, each id is looked up).")

    def run(self, *, task_ids: list[str], queue: str | None, **options: Any) -> None:
        tasks = self.find_tasks(task_ids, queue)
        skipped = [task for task in tasks if task.state != TaskState.ACTIVE]
        sent = [
            {
                "id": task.id,
                "queue": task.queue,
                "worker": task.owner,
                "listeners": self.inspector.cancel(task.id),
            }
            for task in tasks
            if task.state == TaskState.ACTIVE
        ]
        if self.as_json:
            self.write_json(
                {
                    "cancelled": sent,
                    "skipped": [{"id": t.id, "queue": t.queue, "state": str(t.state)} for t in skipped],
                }
            )
        else:
            self.report(sent, skipped)
        if skipped:
            raise CommandError(
                f"{plural(len(skipped), 'task')} skipped: only active tasks can be cancelled "
                "(use rtq_archive or rtq_delete for the others)."
            )

    def report(self, sent: list[dict[str, Any]], skipped: list[TaskInfo]) -> None:
        for request in sent:
            task_id, listeners = request["id"], request["listeners"]
            if listeners:
                line = self.style.SUCCESS(f"Cancellation of {task_id} sent to {plural(listeners, 'worker')}.")
            else:
                line = self.style.WARNING(
                    f"No worker is listening, so {task_id} was not cancelled; if its worker is gone, "
                    "the task goes to retry once its lease expires."
                )
            self.stdout.write(line)
        for task in skipped:
            self.stdout.write(
                self.style.WARNING(
                    f"Skipped {task.id} (queue {task.queue!r}): it is {task.state}, not active."
                )
            )

"""`manage.py rtq_cancel ID [ID ...]`: stop active tasks (and waiting workflows)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rtq.broker.inspect import TaskInfo
from django_rtq.broker.states import ACTION_STATES, Action, TaskState
from django_rtq.formats import plural
from django_rtq.management.base import OperationsCommand, skipped_line
from django_rtq.operations import TaskRef


class Command(OperationsCommand):
    help = (
        "Cancel active tasks: the worker running each one interrupts it and archives it. "
        "A waiting workflow is archived as cancelled at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "task_ids", nargs="+", metavar="ID", help="Ids of active tasks or waiting workflows."
        )
        parser.add_argument("--queue", "-q", help="The tasks' queue (without it, each id is looked up).")

    def run(self, *, task_ids: list[str], queue: str | None, **options: Any) -> None:
        sent: list[dict[str, Any]] = []
        skipped: list[tuple[TaskRef, str]] = []
        gone: list[TaskInfo] = []
        # One at a time: each one's report says whether its own stop reached a worker.
        for task in self.find_tasks(task_ids, queue):
            report = self.ops.act(Action.CANCEL, [task.id], task.queue)
            if report.skipped:
                skipped += report.skipped
            elif report.missing:
                gone.append(task)
            else:
                [ref] = report.acted
                sent.append(
                    {
                        "id": task.id,
                        "queue": task.queue,
                        "state": ref.state,
                        "worker": task.owner,
                        "listeners": report.listeners,
                    }
                )
        if self.as_json:
            self.write_json(
                {
                    "cancelled": sent,
                    "skipped": [
                        {"id": ref.id, "queue": ref.queue, "state": ref.state, "reason": reason}
                        for ref, reason in skipped
                    ],
                    "gone": [task.id for task in gone],
                }
            )
        else:
            self.report(sent, skipped, gone)
        if skipped:
            cancellable = ", ".join(ACTION_STATES[Action.CANCEL])
            raise CommandError(
                f"{plural(len(skipped), 'task')} skipped: only {cancellable} tasks can be cancelled "
                "(use rtq_archive or rtq_delete for the others)."
            )

    def report(
        self, sent: list[dict[str, Any]], skipped: list[tuple[TaskRef, str]], gone: list[TaskInfo]
    ) -> None:
        for request in sent:
            task_id, listeners = request["id"], request["listeners"]
            if request["state"] == TaskState.WAITING:
                line = (
                    self.style.SUCCESS(
                        f"Workflow {task_id} cancelled (archived); its children that have not started "
                        "are archived next."
                    )
                    if listeners
                    else self.style.WARNING(f"Workflow {task_id} had ended meanwhile: nothing to cancel.")
                )
            elif listeners:
                line = self.style.SUCCESS(f"Cancellation of {task_id} sent to {plural(listeners, 'worker')}.")
            else:
                line = self.style.WARNING(
                    f"No worker is listening, so {task_id} was not cancelled; if its worker is gone, "
                    "the task goes to retry once its lease expires."
                )
            self.stdout.write(line)
        for ref, reason in skipped:
            self.stdout.write(self.style.WARNING(skipped_line(ref, reason)))
        for task in gone:
            self.stdout.write(self.style.WARNING(f"{task.id} finished meanwhile: nothing to cancel."))

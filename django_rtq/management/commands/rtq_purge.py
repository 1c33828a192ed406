"""`manage.py rtq_purge QUEUE`: delete every task of a queue but the active ones."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from django_rtq.broker.bulk import PURGE_STATES
from django_rtq.broker.states import TaskState
from django_rtq.formats import plural
from django_rtq.management.base import OperationsCommand


class Command(OperationsCommand):
    help = (
        "Delete every task of a queue in every state but active (waiting workflows, cancelled "
        "first; scheduled, retry, pending, archived, completed), a page at a time, with progress on "
        "stderr. Active tasks are left to their workers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("queue", help="The queue to purge.")
        parser.add_argument(
            "--noinput",
            "--no-input",
            action="store_false",
            dest="interactive",
            help="Do not ask for confirmation.",
        )

    def run(self, *, queue: str, interactive: bool, **options: Any) -> None:
        self.check_queues([queue])
        if interactive and not self.confirm(queue):
            if self.as_json:
                self.write_json({"queue": queue, "purged": False})
            else:
                self.stdout.write("Purge cancelled.")
            return
        job = self.carry_to_the_end(self.ops.purge(queue, budget=self.step_seconds))
        active = self.ops.count(queue, TaskState.ACTIVE)
        # Each state's tasks as the purge found them on reaching it: all deleted, unless some
        # left meanwhile (claimed by a worker, say).
        found = dict(zip(job.states, job.counts, strict=True))
        if self.as_json:
            self.write_json(
                {
                    "queue": queue,
                    "purged": True,
                    "deleted": {str(state): count for state, count in found.items()},
                    "total": job.done,
                    "active_left": active,
                    "job": job.id,
                }
            )
            return
        details = ", ".join(f"{count:,} {state}" for state, count in found.items() if count)
        if details and job.done != job.total:
            details = f"of {job.total:,} found: {details}; the others left meanwhile"
        self.stdout.write(
            self.style.SUCCESS(
                f"Deleted {plural(job.done, 'task')} of queue {queue!r}"
                + (f" ({details})." if details else ".")
            )
        )
        if active:
            them = "it" if active == 1 else "them"
            self.stdout.write(
                self.style.WARNING(
                    f"{plural(active, 'active task')} left alone: cancel {them} with rtq_cancel, "
                    f"or let {them} finish."
                )
            )

    def confirm(self, queue: str) -> bool:
        counts = {state: self.ops.count(queue, state) for state in PURGE_STATES}
        listed = ", ".join(f"{count:,} {state}" for state, count in counts.items())
        # With --json the question goes to stderr, so that stdout holds nothing but JSON.
        out = self.stderr if self.as_json else self.stdout
        out.write(
            f"This will delete every task of queue {queue!r} that is not active ({listed}).\n"
            "This cannot be undone. Are you sure you want to do this?\n\n"
            "    Type 'yes' to continue, or 'no' to cancel: ",
            ending="",
        )
        out.flush()
        return input() == "yes"

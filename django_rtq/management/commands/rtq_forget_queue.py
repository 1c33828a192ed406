"""`manage.py rtq_forget_queue QUEUE [QUEUE ...]`: stop listing queues that nothing uses."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rtq.exceptions import QueueInUse
from django_rtq.management.base import OperationsCommand


class Command(OperationsCommand):
    help = (
        "Forget queues the project names nowhere and nothing uses (no task in any state, no work "
        "under way): they leave rtq_stats, the admin and the metrics until a task is enqueued "
        'to them again. The workers do it by themselves after RTQ["FORGET_EMPTY_QUEUES_AFTER"].'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="The queues to forget.")

    def run(self, *, queues: list[str], **options: Any) -> None:
        names = self.check_queues(queues)
        forgotten, refused = [], []
        for queue in names:
            try:
                self.ops.forget_queue(queue)
            except QueueInUse as exc:
                refused.append(str(exc))
            else:
                forgotten.append(queue)
        if self.as_json:
            self.write_json({"forgotten": forgotten, "refused": refused})
        else:
            for queue in forgotten:
                self.stdout.write(self.style.SUCCESS(f"Forgot queue {queue!r}."))
        if refused:
            raise CommandError("\n".join(refused))

"""`manage.py rtq_prune`: delete mirrored finished tasks older than RTQ["MIRROR_MAX_AGE"]."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_rtq.conf import get_settings
from django_rtq.operations import Operations


class Command(BaseCommand):
    help = "Delete rows of finished tasks (the ORM mirror) that finished longer ago than a limit."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            metavar="SECONDS",
            help='Age limit in seconds (default: RTQ["MIRROR_MAX_AGE"]).',
        )
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        seconds = (
            options["older_than"] if options["older_than"] is not None else get_settings().MIRROR_MAX_AGE
        )
        if seconds < 0:
            raise CommandError("--older-than takes a non-negative number of seconds.")
        cutoff = timezone.now() - timedelta(seconds=seconds)
        deleted, _ = Operations().finished_tasks().filter(finished_at__lt=cutoff).delete()
        if options["json"]:
            self.stdout.write(json.dumps({"deleted": deleted, "cutoff": cutoff.isoformat()}))
        else:
            self.stdout.write(
                f"Deleted {deleted} finished task(s) that finished before {cutoff:%Y-%m-%d %H:%M:%S %Z}."
            )

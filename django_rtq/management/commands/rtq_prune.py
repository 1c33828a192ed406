"""`manage.py rtq_prune`: delete mirrored finished tasks older than RTQ["MIRROR_MAX_AGE"], now."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_rtq.conf import get_settings
from django_rtq.mirror import prune
from django_rtq.operations import Operations


class Command(BaseCommand):
    help = (
        "Delete rows of finished tasks (the ORM mirror) that finished longer ago than a limit, "
        "a batch at a time. The workers do it by themselves (RTQ['MIRROR_MAX_AGE']): this is for "
        "a one-off, with another limit, or where no worker mirrors."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            metavar="SECONDS",
            help='Age limit in seconds (default: RTQ["MIRROR_MAX_AGE"]).',
        )
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        seconds = options["older_than"]
        if seconds is None:
            seconds = get_settings().MIRROR_MAX_AGE
            if seconds is None:
                raise CommandError(
                    'RTQ["MIRROR_MAX_AGE"] is None (rows are kept for good): say how old with --older-than.'
                )
        if seconds < 0:
            raise CommandError("--older-than takes a non-negative number of seconds.")
        cutoff = timezone.now() - timedelta(seconds=seconds)
        deleted = prune(cutoff, using=Operations().finished_tasks().db)
        if options["json"]:
            self.stdout.write(json.dumps({"deleted": deleted, "cutoff": cutoff.isoformat()}))
        else:
            self.stdout.write(
                f"Deleted {deleted} finished task(s) that finished before {cutoff:%Y-%m-%d %H:%M:%S %Z}."
            )

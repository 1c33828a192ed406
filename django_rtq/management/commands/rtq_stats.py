"""`manage.py rtq_stats`: each queue's tasks per state, today's counters, the outbox, tasks waiting for
a worker that can run them, flow control, and daily history."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_rtq.broker.inspect import LimitUse, QueueStats
from django_rtq.broker.limits import QUEUE_SCOPE
from django_rtq.broker.waiting import WaitingKind
from django_rtq.formats import format_duration, utc_datetime
from django_rtq.management.base import OperationsCommand
from django_rtq.management.table import render_table
from django_rtq.outbox import OutboxStats

STATS_HEADERS = (
    "QUEUE",
    "PAUSED",
    "PENDING",
    "ACTIVE",
    "SCHEDULED",
    "RETRY",
    "ARCHIVED",
    "COMPLETED",
    "WAITING",
    "PROCESSED TODAY",
    "FAILED TODAY",
    "OLDEST PENDING",
)
LIMIT_HEADERS = ("SCOPE", "LIMIT", "RUNNING", "HELD BACK", "TOKENS NOW")
WAITING_HEADERS = ("TASK", "WHY", "TASKS", "WAITING FOR", "REASON")


class Command(OperationsCommand):
    help = (
        "Show each queue's tasks per state, today's processed and failed counts, paused queues, "
        "the tasks waiting in the outbox, the tasks waiting for a worker that can run them, and the "
        "flow-control limits with their use."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queues to show (default: all).")
        parser.add_argument(
            "--history",
            type=int,
            metavar="DAYS",
            help="Also show processed and failed counts for each of the last DAYS days (UTC).",
        )

    def run(self, *, queues: list[str], history: int | None, **options: Any) -> None:
        if history is not None and history < 1:
            raise CommandError("--history must be at least 1 day.")
        names = self.check_queues(queues) if queues else self.queue_names()
        stats = [self.ops.queue_stats(name) for name in names]
        limits = {name: self.ops.flow_control(name) for name in names}
        waiting = {name: self.ops.waiting_for_worker(name) for name in names}
        histories = {name: self.ops.history(name, days=history) for name in names} if history else {}
        outbox = self.outbox_stats()  # after Redis: an unreachable Redis is the command's error
        if self.as_json:
            self.write_json(
                {
                    "queues": [
                        self.stats_data(s, limits[s.queue], waiting[s.queue], histories.get(s.queue))
                        for s in stats
                    ],
                    "outbox": outbox_data(outbox) if outbox else None,
                }
            )
            return
        if stats:
            self.write_lines(render_table(STATS_HEADERS, map(stats_row, stats), header_style=self.heading))
        else:
            self.stdout.write("No queues yet.")
        self.stdout.write("")
        self.stdout.write(outbox_line(outbox))
        now = self.ops.now()
        for name, kinds in waiting.items():
            if kinds:
                self.stdout.write("")
                self.stdout.write(f"Queue {name!r}, tasks waiting for a worker that can run them:")
                rows = [waiting_row(kind, now) for kind in kinds]
                self.write_lines(render_table(WAITING_HEADERS, rows, header_style=self.heading))
        for name, uses in limits.items():
            if uses:
                self.stdout.write("")
                self.stdout.write(f"Queue {name!r}, flow control:")
                self.write_lines(render_table(LIMIT_HEADERS, map(limit_row, uses), header_style=self.heading))
        for name, days in histories.items():
            self.stdout.write("")
            self.stdout.write(f"Queue {name!r}, last {len(days)} days (UTC):")
            rows = [
                (day, processed, failed, failure_rate(processed, failed)) for day, processed, failed in days
            ]
            self.write_lines(
                render_table(("DAY", "PROCESSED", "FAILED", "FAILURE RATE"), rows, header_style=self.heading)
            )

    def outbox_stats(self) -> OutboxStats | None:
        """The outbox's stats, or None (and why, on stderr) if its database cannot be read: the
        queues' stats, from Redis, are shown all the same."""
        try:
            return self.ops.outbox_stats()
        except DatabaseError as exc:
            self.note(f"The outbox's database could not be read: {exc}")
            return None

    def stats_data(
        self,
        stats: QueueStats,
        limits: list[LimitUse],
        waiting: list[WaitingKind],
        days: list[tuple[str, int, int]] | None,
    ) -> dict[str, Any]:
        data = {
            **asdict(stats),
            "size": stats.size,
            "limits": [use.as_dict() for use in limits],
            "waiting_for_worker": [waiting_data(kind) for kind in waiting],
        }
        if days is not None:
            data["history"] = [{"day": d, "processed": p, "failed": f} for d, p, f in days]
        return data


def stats_row(stats: QueueStats) -> tuple[object, ...]:
    return (
        stats.queue,
        stats.paused,
        stats.pending,
        stats.active,
        stats.scheduled,
        stats.retry,
        stats.archived,
        stats.completed,
        stats.waiting,
        stats.processed_today,
        stats.failed_today,
        format_duration(stats.oldest_pending_age),
    )


def outbox_data(stats: OutboxStats) -> dict[str, Any]:
    """The outbox's stats as the API's `outbox/` gives them (times in ISO 8601)."""
    return {
        "waiting": stats.waiting,
        "oldest": stats.oldest.isoformat() if stats.oldest else None,
        "oldest_age_seconds": stats.age_seconds(),
        "failing": stats.failing,
    }


def outbox_line(stats: OutboxStats | None) -> str:
    """`Outbox: 3 waiting, oldest 3m 12s ago, 1 failing`, or that it is empty, or unknown."""
    if stats is None:
        return "Outbox: unknown (its database could not be read)"
    if not stats.waiting:
        return "Outbox: empty"
    age = format_duration(stats.age_seconds())
    return f"Outbox: {stats.waiting} waiting, oldest {age} ago, {stats.failing} failing"


def waiting_data(kind: WaitingKind) -> dict[str, Any]:
    """A kind of tasks waiting for a worker as the API's queues give it (times in ISO 8601)."""
    since = utc_datetime(kind.since)
    return {**asdict(kind), "since": since.isoformat() if since else None}


def waiting_row(kind: WaitingKind, now: float) -> tuple[object, ...]:
    waited = format_duration(max(0.0, now - kind.since)) if kind.since is not None else None
    return (kind.task, kind.why, kind.count, waited, kind.reason)


def limit_row(use: LimitUse) -> tuple[object, ...]:
    limit = use.limit
    if use.partition == "":  # the limits each partition has: no use of its own
        return (use.label, limit.describe() if limit else "(none now: draining)", None, None, None)
    running: object = use.running
    if limit and limit.max_concurrency is not None:
        running = f"{use.running} of {limit.max_concurrency}"
    tokens = None
    if use.tokens is not None and limit is not None:
        tokens = f"{use.tokens:.1f} of {limit.burst}"
    return (
        "(whole queue)" if use.scope == QUEUE_SCOPE else use.label,
        limit.describe() if limit else "(none now: draining)",
        running,
        None if use.scope == QUEUE_SCOPE else use.held,
        tokens,
    )


def failure_rate(processed: int, failed: int) -> str | None:
    return f"{100 * failed / processed:.1f}%" if processed else None

"""`manage.py rtq_top`: a live view of the queues and workers, redrawn every few seconds."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rtq.broker.broker import utc_day
from django_rtq.broker.inspect import QueueStats
from django_rtq.exceptions import BrokerUnavailable
from django_rtq.formats import plural
from django_rtq.management.base import OperationsCommand
from django_rtq.management.commands.rtq_stats import STATS_HEADERS, stats_row
from django_rtq.management.commands.rtq_workers import worker_row
from django_rtq.management.table import format_time, render_table

#: Moves the cursor home and clears the screen (ANSI), between frames on a terminal.
CLEAR_SCREEN = "\x1b[H\x1b[2J"
QUEUE_HEADERS = (*STATS_HEADERS, "PER SECOND")
WORKER_HEADERS = ("WORKER", "HOST", "PID", "QUEUES", "CONCURRENCY", "RUNNING")


@dataclass(slots=True)
class Snapshot:
    """What one frame shows: read through the operations layer at `at` (the broker's clock)."""

    at: float
    queues: list[QueueStats]
    workers: list[dict[str, Any]]
    #: Attempts finished per second in each queue since the previous frame (None on the first).
    rates: dict[str, float | None] = field(default_factory=dict)


class Command(OperationsCommand):
    help = (
        "A live view of the queues (tasks per state, processed and failed today, paused) and of the "
        "workers, redrawn every --interval seconds until Ctrl-C; --once prints one frame."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queues to show (default: all).")
        parser.add_argument(
            "--interval", type=float, default=2.0, help="Seconds between two frames (default: 2)."
        )
        parser.add_argument("--once", action="store_true", help="Print one frame and exit.")

    def run(self, *, queues: list[str], interval: float, once: bool, **options: Any) -> None:
        if interval <= 0:
            raise CommandError("--interval must be more than 0 seconds.")
        names = self.check_queues(queues) if queues else None
        clear = self.stdout.isatty() and not self.as_json
        previous: Snapshot | None = None
        try:
            while True:
                try:
                    snapshot = self.snapshot(names, previous)
                except BrokerUnavailable as exc:
                    if once:
                        raise
                    # A live view rides out an outage: it says so and tries again next frame.
                    self.show([f"Cannot reach Redis: {exc}"], clear)
                else:
                    self.show(self.frame(snapshot, interval), clear)
                    previous = snapshot
                if once:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return

    def snapshot(self, names: list[str] | None, previous: Snapshot | None) -> Snapshot:
        queues = [self.ops.queue_stats(name) for name in names or self.queue_names()]
        snapshot = Snapshot(at=self.now(), queues=queues, workers=self.ops.workers())
        snapshot.rates = {stats.queue: rate(stats, snapshot.at, previous) for stats in queues}
        return snapshot

    def frame(self, snapshot: Snapshot, interval: float) -> list[str]:
        if self.as_json:  # one JSON object per frame and line (JSON Lines)
            data = {
                "at": snapshot.at,
                "queues": [
                    {**asdict(s), "size": s.size, "per_second": snapshot.rates.get(s.queue)}
                    for s in snapshot.queues
                ],
                "workers": snapshot.workers,
            }
            return [json.dumps(data, ensure_ascii=False)]
        lines = [
            f"django-rtq  {format_time(snapshot.at)}  {plural(len(snapshot.queues), 'queue')}, "
            f"{plural(len(snapshot.workers), 'live worker')}  (every {interval:g}s; Ctrl-C to quit)",
            "",
        ]
        if snapshot.queues:
            rows = [(*stats_row(s), _rounded(snapshot.rates.get(s.queue))) for s in snapshot.queues]
            lines += render_table(QUEUE_HEADERS, rows, header_style=self.heading)
        else:
            lines.append("No queues yet.")
        lines.append("")
        if snapshot.workers:
            lines += render_table(
                WORKER_HEADERS, map(worker_row, snapshot.workers), header_style=self.heading
            )
        else:
            lines.append("No live workers.")
        return lines

    def show(self, lines: list[str], clear: bool) -> None:
        if clear:
            self.stdout.write(CLEAR_SCREEN, ending="")
        self.write_lines(lines)
        self.stdout.flush()


def rate(stats: QueueStats, at: float, previous: Snapshot | None) -> float | None:
    """Attempts finished per second since the previous frame; None without one, or across
    midnight UTC (the daily counter started again)."""
    if previous is None or at <= previous.at or utc_day(at) != utc_day(previous.at):
        return None
    before = next((s for s in previous.queues if s.queue == stats.queue), None)
    if before is None or stats.processed_today < before.processed_today:
        return None
    return (stats.processed_today - before.processed_today) / (at - previous.at)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)

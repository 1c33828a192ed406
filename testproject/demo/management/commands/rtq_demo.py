"""`manage.py rtq_demo`: enqueue the demo's tasks and watch them reach their final states.

Run a worker alongside (`manage.py rtq_worker`), or use `scripts/demo`, which does it all.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.core.management.color import supports_color
from django.db import DatabaseError, transaction
from django.utils.termcolors import colorize

from demo.tasks import (
    fetch_exchange_rates,
    generate_report,
    import_legacy_data,
    send_trial_reminder,
    send_welcome_email,
)
from django_rtq import Operations, enqueue_many, get_broker
from django_rtq.broker import TaskMessage
from django_rtq.conf import get_settings
from django_rtq.exceptions import BrokerUnavailable, TaskNotFound

#: States a task does not leave by itself.
FINAL_STATES = frozenset({"completed", "archived", "gone"})
#: How each state is coloured.
STATE_STYLES: dict[str, dict[str, Any]] = {
    "scheduled": {"fg": "magenta"},
    "pending": {"fg": "blue", "opts": ("bold",)},
    "active": {"fg": "cyan", "opts": ("bold",)},
    "retry": {"fg": "yellow", "opts": ("bold",)},
    "completed": {"fg": "green", "opts": ("bold",)},
    "archived": {"fg": "red", "opts": ("bold",)},
    "gone": {"fg": "red"},
}
#: QueueStats fields the summary shows.
STATS_COLUMNS = (
    "pending",
    "active",
    "scheduled",
    "retry",
    "archived",
    "completed",
    "processed_today",
    "failed_today",
)
USERS = ("ada", "grace", "linus")
LABEL_WIDTH = 32


@dataclass(frozen=True, slots=True)
class Row:
    """One task as the table shows it."""

    label: str
    task_id: str
    queue: str
    state: str  # a TaskState, or "gone" when Redis no longer has the task
    due_in: float | None  # seconds until a scheduled or retry task runs
    retries: str
    error: str
    result: Any

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def state_text(self) -> str:
        if self.due_in is not None and self.state in ("scheduled", "retry"):
            return f"{self.state} ({self.due_in:.1f}s)" if self.due_in > 0 else f"{self.state} (due)"
        return self.state


class Command(BaseCommand):
    help = "Enqueue the demo tasks and show them live until each is completed or archived."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--timeout",
            type=float,
            default=60.0,
            help="Seconds to wait for every task to finish before giving up (exit code 1).",
        )
        parser.add_argument(
            "--interval", type=float, default=0.5, help="Seconds between two looks at the tasks."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.color = options["force_color"] or (not options["no_color"] and supports_color())
        self.live = self.stdout.isatty()
        self.drawn_lines = 0
        conf = get_settings()
        try:
            get_broker().ping()
        except BrokerUnavailable as exc:
            raise CommandError(
                f"Cannot reach Redis at {_safe_url(conf.REDIS_URL)} ({exc}). Start one, or set RTQ_REDIS_URL."
            ) from None

        self.line(
            self.bold("django-rtq demo")
            + f"  ·  Redis {_safe_url(conf.REDIS_URL)}  ·  key prefix {conf.KEY_PREFIX!r}"
        )
        tracked = self.enqueue_demo_tasks()
        try:
            self.watch(tracked, timeout=options["timeout"], interval=options["interval"])
        except KeyboardInterrupt:
            self.stderr.write("\nInterrupted.")
            raise SystemExit(130) from None

    # Enqueueing

    def enqueue_demo_tasks(self) -> list[tuple[str, TaskMessage]]:
        """Enqueue one of each demo task, the ways a project would; return (label, message)."""
        tag = uuid.uuid4().hex[:6]
        try:
            # New users get their welcome email once the transaction that created them
            # commits: a worker can never look for a user that is not in the database yet.
            with transaction.atomic():
                users = [
                    get_user_model().objects.create_user(
                        username=f"{name}-{tag}", email=f"{name}.{tag}@example.com"
                    )
                    for name in USERS
                ]
                emails = [send_welcome_email.enqueue_on_commit(user.pk) for user in users]
        except DatabaseError as exc:
            raise CommandError(f"The database is not ready ({exc}); run manage.py migrate.") from None

        # Several task types, several queues, one round trip.
        report, legacy, rates = enqueue_many(
            [
                generate_report.prepare(f"sales-{tag}"),
                import_legacy_data.prepare(),
                fetch_exchange_rates.prepare("USD"),
            ]
        )
        reminder = send_trial_reminder.using(delay=5).enqueue(users[0].pk)

        self.line(f"\nEnqueued {len(emails) + 4} tasks:")
        for text, detail in (
            (
                f"{len(emails)} x send_welcome_email",
                "on commit of the transaction creating the users",
            ),
            ("generate_report", "max_retries=3: fails once, then succeeds on its retry"),
            ("import_legacy_data", "max_retries=1: fails twice, so it ends archived"),
            ("fetch_exchange_rates", "an async def handler"),
            ("send_trial_reminder", "scheduled with .using(delay=5)"),
        ):
            self.line(f"  · {text:<24} {detail}")
        self.line("")
        messages = [*emails, report, legacy, rates, reminder]
        return [(_label(message), message) for message in messages]

    # Watching

    def watch(self, tracked: list[tuple[str, TaskMessage]], *, timeout: float, interval: float) -> None:
        ops = Operations()
        started = time.monotonic()
        shown: tuple | None = None
        while True:
            rows = [self.row(ops, label, message) for label, message in tracked]
            workers = ops.workers()
            elapsed = time.monotonic() - started
            finished = all(row.is_final for row in rows)
            timed_out = not finished and elapsed >= timeout
            snapshot = tuple((row.state, row.retries, row.error) for row in rows)
            if self.live:
                self.redraw(self.table_lines(rows, elapsed, len(workers)))
            elif snapshot != shown or finished or timed_out:
                # Not a terminal (a log, a pipe): print the table when something changed.
                for text in self.table_lines(rows, elapsed, len(workers)):
                    self.line(text)
                self.line("")
            shown = snapshot
            if finished or timed_out:
                break
            time.sleep(interval)

        if self.live:
            self.line("")
        self.summary(ops, rows, workers, elapsed)
        if timed_out:
            left = sum(not row.is_final for row in rows)
            hint = "" if workers else " No worker is running: start one with manage.py rtq_worker."
            raise CommandError(f"Timed out after {timeout:g} s: {left} task(s) did not finish.{hint}")

    def row(self, ops: Any, label: str, message: TaskMessage) -> Row:
        try:
            info = ops.live_task(message.id, queue=message.queue)
        except TaskNotFound:  # deleted: by hand, or its retention ended
            return Row(label, message.id, message.queue, "gone", None, "", "", None)
        error = ""
        if info.last_error:
            kind = str(info.info.get("error_type", "")).rsplit(".", 1)[-1]
            error = f"{kind}: {info.last_error}" if kind else info.last_error
        return Row(
            label=label,
            task_id=info.id,
            queue=info.queue,
            state=str(info.state),
            due_in=info.score_at - time.time() if info.score_at else None,
            retries=f"{info.retried}/{message.max_retries}",
            error=error,
            result=info.result,
        )

    def table_lines(self, rows: list[Row], elapsed: float, workers: int) -> list[str]:
        done = sum(row.is_final for row in rows)
        status = f"{self.bold(f't+{elapsed:.1f}s')}   {done}/{len(rows)} finished   workers online: {workers}"
        header = ("TASK", "ID", "QUEUE", "STATE", "RETRIES", "LAST ERROR")
        cells = [
            (row.label, row.task_id[:8], row.queue, row.state_text, row.retries, row.error) for row in rows
        ]
        widths = [max(len(line[i]) for line in [header, *cells]) for i in range(5)]
        width_left = _terminal_width() - sum(widths) - 2 * 5 - 2 if self.live else None

        def render(line: tuple[str, ...], state: str | None) -> str:
            padded = [text.ljust(width) for text, width in zip(line, widths, strict=False)]
            if state is not None:
                padded[3] = self.paint(padded[3], state)
            last = line[5]
            if width_left is not None and len(last) > width_left:
                last = last[: max(0, width_left - 1)] + "…"
            return "  " + "  ".join([*padded, last]).rstrip()

        lines = [status, self.bold(render(header, None))]
        lines += [render(line, row.state) for line, row in zip(cells, rows, strict=True)]
        return lines

    def summary(self, ops: Any, rows: list[Row], workers: list[dict], elapsed: float) -> None:
        completed = sum(row.state == "completed" for row in rows)
        archived = sum(row.state == "archived" for row in rows)
        if all(row.is_final for row in rows):
            self.line(
                self.paint(
                    f"All {len(rows)} tasks reached a final state in {elapsed:.1f} s: "
                    f"{completed} completed, {archived} archived.",
                    "completed",
                )
            )
        else:
            self.line(self.paint(f"Stopped waiting after {elapsed:.1f} s.", "archived"))

        self.line("\n" + self.bold("Results"))
        for row in rows:
            if row.state == "completed":
                self.line(f"  {row.label:<{LABEL_WIDTH}}  {json.dumps(row.result)}")
            elif row.state == "archived":
                self.line(f"  {row.label:<{LABEL_WIDTH}}  {self.paint(row.error, 'archived')}")

        self.line("\n" + self.bold("Queues") + " (Operations().queue_stats(queue))")
        table = [tuple(name.upper() for name in ("queue", *STATS_COLUMNS))]
        for stats in map(ops.queue_stats, ops.queues()):
            name = stats.queue + (" (paused)" if stats.paused else "")
            table.append((name, *(str(getattr(stats, column)) for column in STATS_COLUMNS)))
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
        for n, line in enumerate(table):
            cells = [line[0].ljust(widths[0])]
            cells += [cell.rjust(width) for cell, width in zip(line[1:], widths[1:], strict=True)]
            text = "  " + "  ".join(cells)
            self.line(self.bold(text) if n == 0 else text)
        self.line("  (processed_today and failed_today count attempts, retries included)")

        self.line("\n" + self.bold("Workers") + f" online: {len(workers)}")
        for worker in workers:
            queues = ", ".join(f"{name}:{weight}" for name, weight in worker.get("queues", {}).items())
            self.line(
                f"  {worker.get('id')}  queues {queues}  concurrency {worker.get('concurrency')}  "
                f"running {len(worker.get('active', []))}"
            )

    # Output

    def line(self, text: str) -> None:
        self.stdout.write(text)

    def redraw(self, lines: list[str]) -> None:
        """Draw the table over the previous one (a terminal only)."""
        if self.drawn_lines:
            self.stdout.write(f"\x1b[{self.drawn_lines}A\r\x1b[J", ending="")
        self.stdout.write("\n".join(lines))
        self.stdout.flush()
        self.drawn_lines = len(lines)

    def paint(self, text: str, state: str) -> str:
        return colorize(text, **STATE_STYLES.get(state, {})) if self.color else text

    def bold(self, text: str) -> str:
        return colorize(text, opts=("bold",)) if self.color else text


def _label(message: TaskMessage) -> str:
    """Show a task as its function name and arguments, cut to fit the table."""
    arguments = [repr(arg) for arg in message.args]
    arguments += [f"{key}={value!r}" for key, value in message.kwargs.items()]
    label = f"{message.task.rsplit('.', 1)[-1]}({', '.join(arguments)})"
    return label if len(label) <= LABEL_WIDTH else label[: LABEL_WIDTH - 2] + "…)"


def _terminal_width() -> int:
    return shutil.get_terminal_size((120, 24)).columns


def _safe_url(url: str) -> str:
    """Hide a password in a Redis URL."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        parts = parts._replace(netloc=netloc)
    return urlunsplit(parts)

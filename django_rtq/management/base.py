"""What the rtq_* commands share: Operations, --json, errors, argument checks, bulk progress."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rtq.broker.bulk import BulkJob
from django_rtq.broker.inspect import TaskInfo
from django_rtq.broker.message import OPTION_FIELDS
from django_rtq.broker.states import ACTION_STATES, Action, ActionNotAllowed, TaskState, check_action
from django_rtq.exceptions import BrokerUnavailable, QueueNotFound, RTQError, TaskNotFound
from django_rtq.formats import plural
from django_rtq.operations import DONE, Operations, TaskRef
from django_rtq.task_view import TaskView

#: What the time kept with a task means in each state (the score of its sorted set).
STATE_TIME_KEYS = {
    TaskState.SCHEDULED: "next_run_at",
    TaskState.RETRY: "next_run_at",
    TaskState.ACTIVE: "lease_expires_at",
    TaskState.ARCHIVED: "archived_at",
    TaskState.COMPLETED: "expires_at",
}
STATE_TIME_LABELS = {
    "next_run_at": "next run",
    "lease_expires_at": "lease expires",
    "archived_at": "archived at",
    "expires_at": "expires",
}


def task_as_dict(task: TaskView) -> dict[str, Any]:
    """Everything known about a live task, as JSON-ready data (times in epoch seconds)."""
    message = task.message
    data: dict[str, Any] = {
        "id": task.id,
        "queue": task.queue,
        "state": str(task.state),
        "task": task.task,
        "args": message.args if message else None,
        "kwargs": message.kwargs if message else None,
        "options": {name: getattr(message, name) for name in OPTION_FIELDS} if message else None,
        "retried": task.retried,
        "last_error": task.error,
        "error_type": task.error_type,
        "traceback": task.traceback,
        "info": task.attempt.as_dict(),
        "result": task.result,
        "worker": task.owner,
    }
    time_key = STATE_TIME_KEYS.get(task.state)
    if time_key:
        data[time_key] = task.score_at
    if message is None:
        data["raw_message"] = task.raw_message  # kept so a corrupt message can be looked at
    return data


def job_progress(job: BulkJob) -> str:
    """`12,000 of 1,000,000 tasks deleted (1%)`, and the workflows a run skipped."""
    skipped = f", {plural(job.skipped, 'workflow')} skipped" if job.skipped else ""
    return f"{job.done:,} of {job.total:,} tasks {DONE[job.action]}{skipped} ({job.percent}%)"


class OperationsCommand(BaseCommand):
    """A command over the operations layer (trusted: the operator at the shell), with --json and
    django-rtq errors turned into CommandError."""

    ops: Operations
    as_json: bool
    #: How long (seconds) the command works on a bulk job between two progress lines.
    step_seconds: float = 1.0

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="Print JSON (and nothing else) instead of a table."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = options["json"]
        try:
            self.ops = Operations()
            self.run(**options)
        except BrokerUnavailable as exc:
            raise CommandError(f"Cannot reach Redis: {exc}") from None
        except RTQError as exc:
            raise CommandError(str(exc)) from None

    def run(self, **options: Any) -> None:
        raise NotImplementedError

    def now(self) -> float:
        """The broker's clock, which the times shown are relative to."""
        return self.ops.now()

    # Output

    def write_json(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.stdout.write(line)

    def heading(self, text: str) -> str:
        return self.style.MIGRATE_HEADING(text)

    def note(self, text: str) -> None:
        """A line on stderr, unstyled: stdout keeps the result (and nothing but JSON with --json)."""
        self.stderr.write(text, style_func=lambda line: line)

    # Checking arguments

    def queue_names(self) -> list[str]:
        """Queues enqueued to at least once, and those in settings.RTQ['QUEUES']."""
        return self.ops.queues()

    def check_queues(self, names: Sequence[str]) -> list[str]:
        """The names, once each, if every one is a known queue."""
        try:
            return [self.ops.check_queue(name) for name in dict.fromkeys(names)]
        except QueueNotFound as exc:
            raise CommandError(str(exc)) from None

    def check_state(self, value: str) -> TaskState:
        try:
            return TaskState(value.lower())
        except ValueError:
            raise CommandError(f"Unknown state {value!r}. States: {', '.join(TaskState)}.") from None

    def find_tasks(self, task_ids: Sequence[str], queue: str | None) -> list[TaskInfo]:
        """Look every id up (in `queue`, or in every queue); fail naming the unknown ones."""
        if queue:
            self.check_queues([queue])
        found, missing = [], []
        for task_id in dict.fromkeys(task_ids):
            try:
                found.append(self.ops.live_task(task_id, queue))
            except TaskNotFound:
                missing.append(task_id)
        self.fail_on_unknown(missing, queue)
        return found

    def locate_all(self, task_ids: Sequence[str], queue: str | None) -> list[TaskRef]:
        """Where each id is (in `queue`, or in any queue); fail naming the unknown ones."""
        if queue:
            self.check_queues([queue])
        refs = self.ops.locate(task_ids, queue)
        located = {ref.id for ref in refs}
        self.fail_on_unknown(
            [task_id for task_id in dict.fromkeys(task_ids) if task_id not in located], queue
        )
        return refs

    def fail_on_unknown(self, missing: Sequence[str], queue: str | None) -> None:
        if missing:
            where = f" in queue {queue!r}" if queue else ""
            raise CommandError(
                f"Unknown task id{'s' if len(missing) > 1 else ''}{where}: {', '.join(missing)}."
            )

    # Bulk jobs

    def carry_to_the_end(self, job: BulkJob, *, label: str = "") -> BulkJob:
        """Carry a bulk job on until it finishes, with a progress line on stderr after each step
        that leaves it unfinished (unless --json). On Ctrl-C, leave it to the workers."""
        try:
            while not job.finished:
                if not self.as_json:
                    self.note(label + job_progress(job))
                started = time.monotonic()
                job = self.ops.carry_on(job.queue, job.id, budget=self.step_seconds)
                if not job.finished:
                    # Back early, unfinished: someone else (a worker) holds the job. Look again
                    # after a step rather than ask again at once.
                    time.sleep(max(0.0, self.step_seconds - (time.monotonic() - started)))
        except KeyboardInterrupt:
            raise CommandError(
                f"Interrupted with {job_progress(job)}: bulk job {job.id} on queue {job.queue!r} is left "
                "to the workers of the queue. `manage.py rtq_bulk` shows it; "
                f"`manage.py rtq_bulk --carry-on {job.id}` carries it on here."
            ) from None
        return job


#: The options that narrow a run of a whole state, by the narrowing they give.
NARROWING_OPTIONS = {"task_name": "--task", "error_class": "--error-class"}


class TaskActionCommand(OperationsCommand):
    """rtq_run, rtq_archive and rtq_delete: act on tasks by id, or on a whole state of a queue."""

    action: Action

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("task_ids", nargs="*", metavar="ID", help="Ids of the tasks.")
        parser.add_argument("--queue", "-q", help="The tasks' queue (without it, each id is looked up).")
        parser.add_argument(
            "--all",
            metavar="STATE",
            dest="all_state",
            help=f"Every task of --queue in STATE ({', '.join(ACTION_STATES[self.action])}), "
            "a page at a time, with progress on stderr.",
        )

    def run(self, *, task_ids: list[str], queue: str | None, all_state: str | None, **options: Any) -> None:
        narrowing = self.narrowing(options)
        if all_state is not None:
            self.run_bulk(task_ids, queue, all_state, narrowing)
        elif narrowing:
            given = " and ".join(NARROWING_OPTIONS[name] for name in narrowing)
            raise CommandError(f"{given} go with --all.")
        else:
            self.run_by_id(task_ids, queue)

    def narrowing(self, options: dict[str, Any]) -> dict[str, str]:
        """The options that narrow an action on a whole state (rtq_run's), those given."""
        return {}

    def run_bulk(
        self, task_ids: list[str], queue: str | None, all_state: str, narrowing: dict[str, str] | None = None
    ) -> None:
        if task_ids:
            raise CommandError("Give task ids or --all STATE, not both.")
        if not queue:
            raise CommandError("--all needs --queue.")
        self.check_queues([queue])
        state = self.check_state(all_state)
        try:
            check_action(self.action, state)
        except ActionNotAllowed as exc:
            raise CommandError(exc.sentence(f"rtq_{self.action} --all")) from exc
        job = self.ops.start_bulk(self.action, queue, [state], budget=self.step_seconds, **(narrowing or {}))
        job = self.carry_to_the_end(job)
        if self.as_json:
            self.write_json(
                {
                    "action": self.action,
                    "queue": queue,
                    "state": state,
                    "count": job.done,
                    "skipped": job.skipped,
                    "job": job.id,
                    **(narrowing or {}),
                }
            )
            return
        self.stdout.write(
            self.style.SUCCESS(f"{plural(job.done, f'{state} task')} of queue {queue!r} {DONE[self.action]}.")
        )
        if job.skipped and narrowing:
            self.stdout.write(
                self.style.WARNING(
                    f"{plural(job.skipped, 'task')} left {state}: of another type or error, or workflows."
                )
            )
        elif job.skipped:
            self.stdout.write(
                self.style.WARNING(
                    f"{plural(job.skipped, 'workflow')} left {state}: a finished workflow cannot be run "
                    "again; enqueue it anew."
                )
            )

    def run_by_id(self, task_ids: list[str], queue: str | None) -> None:
        if not task_ids:
            raise CommandError("Give task ids, or --queue QUEUE --all STATE.")
        self.locate_all(task_ids, queue)  # unknown ids stop the command before it acts on any
        report = self.ops.act(self.action, task_ids, queue)
        if self.as_json:
            self.write_json(
                {
                    "action": self.action,
                    "count": report.count,
                    "ids": [ref.id for ref in report.acted],
                    "skipped": [
                        {"id": ref.id, "queue": ref.queue, "state": ref.state, "reason": reason}
                        for ref, reason in report.skipped
                    ],
                }
            )
        else:
            self.stdout.write(self.style.SUCCESS(f"{plural(report.count, 'task')} {DONE[self.action]}."))
            for ref, reason in report.skipped:
                self.stdout.write(self.style.WARNING(skipped_line(ref, reason)))
            # Found by the check above, then gone or moved before the action reached them.
            meanwhile = report.changed_meanwhile + len(report.missing)
            if meanwhile:
                self.stdout.write(
                    self.style.WARNING(
                        f"{plural(meanwhile, 'task')} changed state meanwhile and "
                        f"{'was' if meanwhile == 1 else 'were'} left alone."
                    )
                )
        if report.skipped:
            count = len(report.skipped)
            raise CommandError(
                f"{plural(count, 'task')} skipped: {self.action} does not apply to "
                f"{'it' if count == 1 else 'them'}."
            )


def skipped_line(ref: TaskRef, reason: str) -> str:
    """`Skipped ID (queue 'q'): why.`, and what to do instead with an active task."""
    line = f"Skipped {ref.id} (queue {ref.queue!r}): {reason}."
    if ref.state == TaskState.ACTIVE:
        line += " Cancel it with rtq_cancel, or let it finish."
    return line


class QueueSwitchCommand(OperationsCommand):
    """rtq_pause and rtq_resume."""

    pause: bool

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("queues", nargs="+", metavar="QUEUE", help="Queues to change.")

    def run(self, *, queues: list[str], **options: Any) -> None:
        word = "paused" if self.pause else "resumed"
        switch = self.ops.pause if self.pause else self.ops.resume
        changes = [
            {"queue": queue, "paused": self.pause, "changed": switch(queue)}
            for queue in self.check_queues(queues)  # all checked before any is changed
        ]
        if self.as_json:
            self.write_json({"queues": changes})
            return
        for change in changes:
            if change["changed"]:
                self.stdout.write(self.style.SUCCESS(f"Queue {change['queue']!r} {word}."))
            else:
                self.stdout.write(
                    f"Queue {change['queue']!r} was already {'paused' if self.pause else 'running'}."
                )

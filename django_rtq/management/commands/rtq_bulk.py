"""`manage.py rtq_bulk`: list bulk jobs (actions on whole states), and carry unfinished ones on."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_rtq.broker.bulk import BulkJob
from django_rtq.formats import plural
from django_rtq.management.base import OperationsCommand
from django_rtq.management.table import format_relative, render_table
from django_rtq.operations import DONE

HEADERS = ("ID", "QUEUE", "ACTION", "STATES", "DONE", "%", "STARTED BY", "STARTED", "FINISHED")


class Command(OperationsCommand):
    help = (
        "List bulk jobs (rtq_run/rtq_archive/rtq_delete --all, rtq_purge, the admin's and the API's "
        "actions on whole states), or carry unfinished ones on to the end with --carry-on."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "job_ids",
            nargs="*",
            metavar="JOB_ID",
            help="With --carry-on: the jobs (default: every unfinished one).",
        )
        parser.add_argument("--queue", "-q", help="Only the jobs of this queue.")
        parser.add_argument(
            "--carry-on",
            action="store_true",
            help="Work on unfinished jobs here until they finish, with progress on stderr.",
        )

    def run(self, *, job_ids: list[str], queue: str | None, carry_on: bool, **options: Any) -> None:
        if queue:
            self.check_queues([queue])
        if job_ids and not carry_on:
            raise CommandError("Job ids go with --carry-on (without it, every job is listed).")
        jobs = self.ops.bulk_jobs(queue)
        if carry_on:
            self.carry_on_jobs(self.pick(jobs, job_ids, queue))
        else:
            self.list_jobs(jobs, queue)

    def pick(self, jobs: list[BulkJob], job_ids: list[str], queue: str | None) -> list[BulkJob]:
        """The jobs named (all of them known), or every unfinished one, the oldest first."""
        if not job_ids:
            return sorted((job for job in jobs if not job.finished), key=lambda job: job.started_at)
        by_id = {job.id: job for job in jobs}
        unknown = [job_id for job_id in dict.fromkeys(job_ids) if job_id not in by_id]
        if unknown:
            where = f" on queue {queue!r}" if queue else ""
            raise CommandError(
                f"Unknown bulk job{'s' if len(unknown) > 1 else ''}{where}: {', '.join(unknown)} "
                "(finished ones go after an hour)."
            )
        return [by_id[job_id] for job_id in dict.fromkeys(job_ids)]

    def carry_on_jobs(self, jobs: list[BulkJob]) -> None:
        finished = []
        for job in jobs:
            if not job.finished:
                job = self.carry_to_the_end(job, label=f"Job {job.id} ({describe(job)}): ")
            finished.append(job)
        if self.as_json:
            self.write_json({"jobs": [job_as_dict(job) for job in finished]})
            return
        if not finished:
            self.stdout.write("No unfinished bulk jobs.")
        for job in finished:
            skipped = f", {plural(job.skipped, 'workflow')} skipped" if job.skipped else ""
            self.stdout.write(
                self.style.SUCCESS(
                    f"Job {job.id} ({describe(job)}) finished: {plural(job.done, 'task')} "
                    f"{DONE[job.action]}{skipped}."
                )
            )

    def list_jobs(self, jobs: list[BulkJob], queue: str | None) -> None:
        if self.as_json:
            self.write_json({"jobs": [job_as_dict(job) for job in jobs]})
            return
        if not jobs:
            self.stdout.write(f"No bulk jobs on queue {queue!r}." if queue else "No bulk jobs.")
            return
        now = self.now()
        rows = [
            (
                job.id,
                job.queue,
                job.action,
                ", ".join(job.states),
                f"{job.done:,} of {job.total:,}",
                f"{job.percent}%",
                job.started_by or None,
                format_relative(job.started_at, now),
                format_relative(job.finished_at, now),
            )
            for job in jobs
        ]
        self.write_lines(render_table(HEADERS, rows, header_style=self.heading))


def describe(job: BulkJob) -> str:
    """`delete the archived tasks of queue 'emails'`."""
    return f"{job.action} the {', '.join(job.states)} tasks of queue {job.queue!r}"


def job_as_dict(job: BulkJob) -> dict[str, Any]:
    """A job as JSON-ready data (times in epoch seconds), with what is worked out from it."""
    return {
        **asdict(job),
        "total": job.total,
        "percent": job.percent,
        "finished": job.finished,
        "current_state": job.current_state,
    }

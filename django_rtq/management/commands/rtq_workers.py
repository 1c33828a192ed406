"""`manage.py rtq_workers`: the workers whose heartbeat is current, and what they are running."""

from __future__ import annotations

from typing import Any

from django_rtq.management.base import OperationsCommand
from django_rtq.management.table import format_relative, render_table


class Command(OperationsCommand):
    help = "List live workers: host, pid, queues, concurrency, tasks in flight, start time."

    def run(self, **options: Any) -> None:
        workers = self.ops.workers()
        if self.as_json:
            self.write_json({"workers": workers})
            return
        if not workers:
            self.stdout.write("No live workers.")
            return
        now = self.now()
        rows = [(*worker_row(worker), format_relative(worker.get("started_at"), now)) for worker in workers]
        headers = ("ID", "HOST", "PID", "QUEUES", "CONCURRENCY", "IN FLIGHT", "STARTED")
        self.write_lines(render_table(headers, rows, header_style=self.heading))
        running = [(worker.get("id"), task) for worker in workers for task in worker.get("active") or []]
        if running:
            self.stdout.write("")
            self.stdout.write("Tasks in flight:")
            rows = [
                (
                    worker_id,
                    task.get("id"),
                    task.get("task"),
                    task.get("queue"),
                    format_relative(task.get("started_at"), now),
                )
                for worker_id, task in running
            ]
            headers = ("WORKER", "TASK ID", "TASK", "QUEUE", "STARTED")
            self.write_lines(render_table(headers, rows, header_style=self.heading))


def format_queues(queues: Any) -> str | None:
    """Show a worker's queues as `name:weight,...` (the form `rtq_worker --queues` takes)."""
    if isinstance(queues, dict):
        return ",".join(f"{name}:{weight}" for name, weight in queues.items())
    if isinstance(queues, list):
        return ",".join(map(str, queues))
    return None


def worker_row(worker: dict[str, Any]) -> tuple[object, ...]:
    """A worker's id, host, pid, queues, concurrency and tasks in flight, as the tables show them."""
    return (
        worker.get("id"),
        worker.get("host"),
        worker.get("pid"),
        format_queues(worker.get("queues")),
        worker.get("concurrency"),
        len(worker.get("active") or []),
    )

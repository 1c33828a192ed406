"""The dashboard: every queue's tasks per state, counters and memory, the outbox, tasks waiting for
a worker that can run them, flow control, workers, bulk jobs, a history chart."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.admin import ModelAdmin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..broker import TaskState
from ..broker.bulk import KEEP_FINISHED_SECONDS, BulkJob
from ..broker.inspect import LimitUse, QueueStats
from ..broker.limits import QUEUE_SCOPE
from ..formats import django_datetime, format_duration
from ..operations import Operations
from .bulk import describe_job
from .charts import history_chart
from .common import STATES, admin_url, live_view, page_context, task_url, waiting_group

logger = logging.getLogger(__name__)

#: Days of history the chart shows.
CHART_DAYS = 28


@live_view()
def dashboard(request: HttpRequest, model_admin: ModelAdmin, ops: Operations) -> HttpResponse:
    names = ops.queues()
    queues = []
    for name in names:
        stats = ops.queue_stats(name)
        queues.append(
            {
                "name": name,
                "stats": stats,
                "states": [
                    (
                        state,
                        state_count(ops, stats, state),
                        admin_url(model_admin, "tasks", state, query={"queue": name}),
                    )
                    for state in STATES
                ],
                "oldest_pending": format_duration(stats.oldest_pending_age),
                "memory": ops.queue_memory(name),
            }
        )
    chart_queue = request.GET.get("chart")
    if chart_queue not in names:
        chart_queue = None
    history = combined_history(ops, [chart_queue] if chart_queue else names, CHART_DAYS)
    context = page_context(
        request,
        model_admin,
        title="Task queue",
        queues=queues,
        outbox=describe_outbox(model_admin, ops),
        workers=describe_workers(model_admin, ops),
        bulk_jobs=[describe_job(model_admin, job) for job in recent_jobs(ops.bulk_jobs(), ops.now())],
        waiting_for_worker=[
            waiting_group(model_admin, name, kinds)
            for name in names
            if (kinds := ops.waiting_for_worker(name))
        ],
        flow_control=[
            {
                "queue": name,
                "scopes": [describe_limit_use(use) for use in uses],
                # held tasks sort after every other pending task: the reversed list shows them first
                "held_url": admin_url(
                    model_admin, "tasks", TaskState.PENDING, query={"queue": name, "order": "reverse"}
                ),
            }
            for name in names
            if (uses := ops.flow_control(name))
        ],
        chart=history_chart(history),
        chart_queue=chart_queue,
        chart_days=CHART_DAYS,
        chart_totals=(sum(row[1] for row in history), sum(row[2] for row in history)),
        queue_action_url=admin_url(model_admin, "queue_action"),
    )
    return TemplateResponse(request, "admin/django_rtq/dashboard.html", context)


def describe_outbox(model_admin: ModelAdmin, ops: Operations) -> dict[str, Any] | None:
    """The outbox's line: tasks waiting, how long the oldest has, how many failed to send; None if
    its database cannot be read (the dashboard is about Redis: it shows the rest all the same)."""
    try:
        stats = ops.outbox_stats()
    except DatabaseError as exc:
        logger.warning("the dashboard could not read the outbox: %s", exc)
        return None
    return {
        "waiting": stats.waiting,
        "oldest_age": format_duration(stats.age_seconds()),
        "failing": stats.failing,
        "url": admin_url(model_admin, "outbox"),
    }


def describe_limit_use(use: LimitUse) -> dict[str, Any]:
    """A row of a queue's flow-control table."""
    limit = use.limit
    return {
        "scope": use.scope,
        "task": use.task,
        "partition": use.partition,
        "is_queue": use.scope == QUEUE_SCOPE,
        "each_partition": use.partition == "",  # the limits each partition has: no use of its own
        "limit": limit.describe() if limit else None,
        "running": use.running,
        "max_concurrency": limit.max_concurrency if limit else None,
        "held": use.held,
        "tokens": None if use.tokens is None else round(use.tokens, 1),
        "burst": limit.burst if limit and limit.rate is not None else None,
        "next_start_in": format_duration(use.next_start_in) if use.next_start_in else None,
    }


def state_count(ops: Operations, stats: QueueStats, state: TaskState) -> int:
    """The size of a state from the queue's stats, or counted if the stats do not have it."""
    count = getattr(stats, state, None)
    return count if isinstance(count, int) else ops.count(stats.queue, state)


def recent_jobs(jobs: list[BulkJob], now: float) -> list[BulkJob]:
    """The running jobs, then those finished within the last hour, each group latest first.

    Workers forget finished jobs after an hour; without a worker they stay, but not on the page.
    """
    since = now - KEEP_FINISHED_SECONDS
    running = [job for job in jobs if not job.finished]
    finished = [job for job in jobs if job.finished_at is not None and job.finished_at >= since]
    return running + finished


def combined_history(ops: Operations, queues: list[str], days: int) -> list[tuple[str, int, int]]:
    """Sum the queues' (day, processed, failed) rows day by day."""
    totals: dict[str, list[int]] = {}
    for queue in queues:
        for day, processed, failed in ops.history(queue, days):
            row = totals.setdefault(day, [0, 0])
            row[0] += processed
            row[1] += failed
    if not totals:  # no queue at all: still draw the days
        today = datetime.now(UTC).date()
        return [((today - timedelta(days=n)).isoformat(), 0, 0) for n in range(days - 1, -1, -1)]
    return [(day, processed, failed) for day, (processed, failed) in sorted(totals.items())]


def describe_workers(model_admin: ModelAdmin, ops: Operations) -> list[dict[str, Any]]:
    described = []
    for worker in ops.workers():
        queues = worker.get("queues")
        if isinstance(queues, dict):
            queues = [f"{name} ({weight})" for name, weight in queues.items()]
        described.append(
            {
                "id": worker.get("id"),
                "host": worker.get("host"),
                "pid": worker.get("pid"),
                "settings": worker.get("settings"),
                "queues": queues or [],
                "concurrency": worker.get("concurrency"),
                "started_at": django_datetime(worker.get("started_at")),
                "tasks": [
                    {
                        "id": task.get("id"),
                        "task": task.get("task"),
                        "url": task_url(model_admin, task["id"], task.get("queue"))
                        if task.get("id")
                        else None,
                        "started_at": django_datetime(task.get("started_at")),
                    }
                    for task in worker.get("active") or []
                ],
            }
        )
    return described

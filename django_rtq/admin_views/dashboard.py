"""The dashboard: every queue's tasks per state, today's counters, workers, and a history chart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..broker import TaskState
from ..broker.inspect import Inspector, QueueStats
from .charts import history_chart
from .common import (
    STATES,
    admin_url,
    as_datetime,
    format_seconds,
    live_view,
    page_context,
    queue_names,
    task_url,
)

#: Days of history the chart shows.
CHART_DAYS = 28


@live_view()
def dashboard(request: HttpRequest, model_admin: ModelAdmin, inspector: Inspector) -> HttpResponse:
    names = queue_names(inspector)
    queues = []
    for name in names:
        stats = inspector.queue_stats(name)
        queues.append(
            {
                "name": name,
                "stats": stats,
                "states": [
                    (
                        state,
                        state_count(inspector, stats, state),
                        admin_url(model_admin, "tasks", state, query={"queue": name}),
                    )
                    for state in STATES
                ],
                "oldest_pending": format_seconds(stats.oldest_pending_age)
                if stats.oldest_pending_age is not None
                else None,
            }
        )
    chart_queue = request.GET.get("chart")
    if chart_queue not in names:
        chart_queue = None
    history = combined_history(inspector, [chart_queue] if chart_queue else names, CHART_DAYS)
    context = page_context(
        request,
        model_admin,
        title="Task queue",
        queues=queues,
        workers=describe_workers(model_admin, inspector),
        chart=history_chart(history),
        chart_queue=chart_queue,
        chart_days=CHART_DAYS,
        chart_totals=(sum(row[1] for row in history), sum(row[2] for row in history)),
        queue_action_url=admin_url(model_admin, "queue_action"),
    )
    return TemplateResponse(request, "admin/django_rtq/dashboard.html", context)


def state_count(inspector: Inspector, stats: QueueStats, state: TaskState) -> int:
    """The size of a state from the queue's stats, or counted if the stats do not have it."""
    count = getattr(stats, state, None)
    return count if isinstance(count, int) else inspector.count(stats.queue, state)


def combined_history(inspector: Inspector, queues: list[str], days: int) -> list[tuple[str, int, int]]:
    """Sum the queues' (day, processed, failed) rows day by day."""
    totals: dict[str, list[int]] = {}
    for queue in queues:
        for day, processed, failed in inspector.history(queue, days):
            row = totals.setdefault(day, [0, 0])
            row[0] += processed
            row[1] += failed
    if not totals:  # no queue at all: still draw the days
        today = datetime.fromtimestamp(inspector.broker.clock(), UTC).date()
        return [((today - timedelta(days=n)).isoformat(), 0, 0) for n in range(days - 1, -1, -1)]
    return [(day, processed, failed) for day, (processed, failed) in sorted(totals.items())]


def describe_workers(model_admin: ModelAdmin, inspector: Inspector) -> list[dict[str, Any]]:
    workers = sorted(inspector.workers(), key=lambda w: (w.get("host", ""), w.get("pid", 0), w.get("id", "")))
    described = []
    for worker in workers:
        queues = worker.get("queues")
        if isinstance(queues, dict):
            queues = [f"{name} ({weight})" for name, weight in queues.items()]
        described.append(
            {
                "id": worker.get("id"),
                "host": worker.get("host"),
                "pid": worker.get("pid"),
                "queues": queues or [],
                "concurrency": worker.get("concurrency"),
                "started_at": as_datetime(worker.get("started_at")),
                "tasks": [
                    {
                        "id": task.get("id"),
                        "task": task.get("task"),
                        "url": task_url(model_admin, task["id"], task.get("queue"))
                        if task.get("id")
                        else None,
                        "started_at": as_datetime(task.get("started_at")),
                    }
                    for task in worker.get("active") or []
                ],
            }
        )
    return described

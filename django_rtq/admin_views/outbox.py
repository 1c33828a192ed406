"""The outbox page: the tasks waiting in the transactional outbox to be sent to Redis, oldest first."""

from __future__ import annotations

from typing import Any

from django.contrib.admin import ModelAdmin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..formats import format_duration
from ..models import OutboxTask
from ..operations import Operations
from ..outbox import OutboxStats
from .common import live_view, page_context
from .tasks import ERROR_SHOWN, shorten

#: Rows the page lists at most: the outbox is empty but during an outage, and the count says the rest.
ROWS_SHOWN = 100


@live_view()
def outbox(request: HttpRequest, model_admin: ModelAdmin, ops: Operations) -> HttpResponse:
    # Read from the database alone: the page works while Redis is away, when the outbox fills.
    stats: OutboxStats | None = None
    rows: list[OutboxTask] = []
    problem = ""
    try:
        stats = ops.outbox_stats()
        rows = list(ops.outbox_tasks()[:ROWS_SHOWN])
    except DatabaseError as exc:
        problem = str(exc)
    context = page_context(
        request,
        model_admin,
        title="Outbox",
        stats=stats,
        oldest_age=format_duration(stats.age_seconds()) if stats else None,
        rows=[describe_row(row) for row in rows],
        problem=problem,
    )
    return TemplateResponse(request, "admin/django_rtq/outbox.html", context)


def describe_row(row: OutboxTask) -> dict[str, Any]:
    """A waiting task as the page lists it."""
    return {
        "id": row.task_id,
        "task": row.task_name,
        "queue": row.queue,
        "created_at": row.created_at,
        "attempts": row.attempts,
        "error": shorten(row.last_error, ERROR_SHOWN) or None,
    }

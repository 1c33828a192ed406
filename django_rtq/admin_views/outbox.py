"""The outbox page: the tasks waiting in the transactional outbox to be sent to Redis, oldest first,
and deleting those one gives up."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from ..formats import format_duration, plural
from ..models import OutboxTask
from ..operations import Operations
from ..outbox import OutboxStats
from .actions import CONFIRM_LISTED, confirmation
from .common import admin_url, live_view, page_context
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
        action_url=admin_url(model_admin, "outbox_action"),
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


@require_POST
@live_view(acts=True)
def outbox_action(request: HttpRequest, model_admin: ModelAdmin, ops: Operations) -> HttpResponse:
    """Delete the posted tasks (`ids`) from the outbox, once confirmed: they are never sent."""
    back = admin_url(model_admin, "outbox")
    task_ids = list(dict.fromkeys(request.POST.getlist("ids")))
    if not task_ids:
        messages.warning(request, "Select tasks first: nothing was done.")
        return HttpResponseRedirect(back)
    if request.POST.get("confirm") != "yes":
        return confirmation(
            request,
            model_admin,
            question=(
                f"Delete {plural(len(task_ids), 'task')} from the outbox? "
                "They are never sent to Redis, and never run."
            ),
            listed=[(task_id, "") for task_id in task_ids[:CONFIRM_LISTED]],
            unlisted=max(0, len(task_ids) - CONFIRM_LISTED),
            hidden=[("ids", task_id) for task_id in task_ids],
            confirm_label="Yes, delete",
            back=back,
        )
    deleted = ops.delete_outbox_tasks(task_ids)
    if deleted:
        messages.success(request, f"{plural(deleted, 'task')} deleted from the outbox: never sent.")
    if deleted < len(task_ids):
        messages.warning(
            request,
            f"{plural(len(task_ids) - deleted, 'selected task')} no longer in the outbox: sent meanwhile.",
        )
    return HttpResponseRedirect(back)

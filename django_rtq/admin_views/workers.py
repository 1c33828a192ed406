"""The workers page: every live worker, its queues, capacity and the tasks it is running."""

from __future__ import annotations

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..formats import format_duration
from ..operations import Operations
from .common import live_view, page_context
from .dashboard import describe_workers


@live_view()
def workers(request: HttpRequest, model_admin: ModelAdmin, ops: Operations) -> HttpResponse:
    now = ops.now()
    described = describe_workers(model_admin, ops)
    for worker in described:
        started = worker["started_at"]
        worker["uptime"] = format_duration(now - started.timestamp()) if started else None
        worker["free"] = (
            max(worker["concurrency"] - len(worker["tasks"]), 0)
            if isinstance(worker["concurrency"], int)
            else None
        )
    context = page_context(
        request,
        model_admin,
        title="Workers",
        workers=described,
        running=sum(len(worker["tasks"]) for worker in described),
        capacity=sum(w["concurrency"] for w in described if isinstance(w["concurrency"], int)),
    )
    return TemplateResponse(request, "admin/django_rtq/workers.html", context)

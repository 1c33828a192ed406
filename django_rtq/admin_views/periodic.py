"""The periodic tasks page: each declared schedule, its task type, last tick dealt with and next one."""

from __future__ import annotations

from typing import Any

from django.contrib.admin import ModelAdmin
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..formats import format_duration
from ..operations import Operations
from ..periodic import Schedule, periodic_task_id
from .common import live_view, page_context, task_url


@live_view()
def periodic(request: HttpRequest, model_admin: ModelAdmin, ops: Operations) -> HttpResponse:
    try:
        schedules, problem = ops.schedules(), None
    except ImproperlyConfigured as exc:  # the system checks say so too; the page should not fail
        schedules, problem = [], str(exc)
    context = page_context(
        request,
        model_admin,
        title="Periodic tasks",
        schedules=[describe_schedule(model_admin, schedule) for schedule in schedules],
        problem=problem,
    )
    return TemplateResponse(request, "admin/django_rtq/periodic.html", context)


def describe_schedule(model_admin: ModelAdmin, schedule: Schedule) -> dict[str, Any]:
    """A schedule as the page shows it: when it runs in words, and a link to its last tick's task."""
    if schedule.cron is not None:
        when = f"cron {schedule.cron}" + (f" ({schedule.timezone})" if schedule.timezone else "")
    else:
        when = f"every {format_duration(schedule.every)}"
    last_task_url = None
    if schedule.last_tick is not None:
        tick_ms = round(schedule.last_tick.timestamp() * 1000)
        last_task_url = task_url(model_admin, periodic_task_id(schedule.name, tick_ms), schedule.queue)
    return {
        "name": schedule.name,
        "task": schedule.task,
        "queue": schedule.queue,
        "when": when,
        "arguments": [schedule.args, schedule.kwargs] if schedule.args or schedule.kwargs else None,
        "source": "settings.RTQ['PERIODIC']" if schedule.source == "settings" else "@task",
        "last_tick": schedule.last_tick,
        "last_task_url": last_task_url,
        "next_run": schedule.next_run,
    }

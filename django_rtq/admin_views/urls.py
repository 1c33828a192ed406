"""The live views' URL patterns, mounted in the admin by `LiveTaskAdmin.get_urls()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, register_converter
from django.urls.converters import get_converters

from .actions import queue_action, task_action
from .bulk import bulk_carry_on, bulk_progress
from .common import SegmentConverter, url_name
from .dashboard import dashboard
from .edit import task_edit
from .outbox import outbox, outbox_action
from .periodic import periodic
from .tasks import task_detail, task_list
from .workers import workers

if "rtq_segment" not in get_converters():
    register_converter(SegmentConverter, "rtq_segment")


def live_urlpatterns(model_admin: ModelAdmin) -> list[URLPattern]:
    """Patterns for the dashboard, lists, task page, workers, periodic tasks, the outbox, actions and
    bulk progress, behind the admin's login."""

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        def admin_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            request.current_app = model_admin.admin_site.name
            return view(request, model_admin, *args, **kwargs)

        return model_admin.admin_site.admin_view(admin_view)

    return [
        path("", wrap(dashboard), name=url_name("dashboard")),
        path("tasks/<str:state>/", wrap(task_list), name=url_name("tasks")),
        path("workers/", wrap(workers), name=url_name("workers")),
        path("periodic/", wrap(periodic), name=url_name("periodic")),
        path("outbox/", wrap(outbox), name=url_name("outbox")),
        # before the task page: an id may hold "/", so its pattern would match this too
        path("task/<rtq_segment:task_id>/edit/", wrap(task_edit), name=url_name("task_edit")),
        path("task/<rtq_segment:task_id>/", wrap(task_detail), name=url_name("task")),
        path("actions/tasks/", wrap(task_action), name=url_name("task_action")),
        path("actions/queue/", wrap(queue_action), name=url_name("queue_action")),
        path("actions/outbox/", wrap(outbox_action), name=url_name("outbox_action")),
        # before the progress page: a queue name may hold "/", so its pattern would match this too
        path(
            "bulk/<rtq_segment:queue>/<str:job_id>/carry-on/",
            wrap(bulk_carry_on),
            name=url_name("bulk_carry_on"),
        ),
        path("bulk/<rtq_segment:queue>/<str:job_id>/", wrap(bulk_progress), name=url_name("bulk")),
    ]

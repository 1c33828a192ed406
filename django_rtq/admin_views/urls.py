"""The live views' URL patterns, mounted in the admin by `LiveTaskAdmin.get_urls()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, register_converter
from django.urls.converters import get_converters

from .actions import queue_action, task_action
from .common import TaskIdConverter, url_name
from .dashboard import dashboard
from .tasks import task_detail, task_list

if "rtq_task_id" not in get_converters():
    register_converter(TaskIdConverter, "rtq_task_id")


def live_urlpatterns(model_admin: ModelAdmin) -> list[URLPattern]:
    """Patterns for the dashboard, lists, task page and actions, behind the admin's login."""

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        def admin_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            request.current_app = model_admin.admin_site.name
            return view(request, model_admin, *args, **kwargs)

        return model_admin.admin_site.admin_view(admin_view)

    return [
        path("", wrap(dashboard), name=url_name("dashboard")),
        path("tasks/<str:state>/", wrap(task_list), name=url_name("tasks")),
        path("task/<rtq_task_id:task_id>/", wrap(task_detail), name=url_name("task")),
        path("actions/tasks/", wrap(task_action), name=url_name("task_action")),
        path("actions/queue/", wrap(queue_action), name=url_name("queue_action")),
    ]

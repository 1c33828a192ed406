"""Admin registrations: the live views over Redis (on `LiveTask`) and the ORM mirror."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import URLPattern
from django.utils.safestring import SafeString

from .admin_views.common import task_url
from .admin_views.urls import live_urlpatterns
from .exceptions import BrokerUnavailable, TaskNotFound
from .models import FinishedTask, LiveTask
from .operations import Operations
from .permissions import CHANGE_LIVE, VIEW_LIVE
from .templatetags.rtq_admin import rtq_json, rtq_pre


@admin.register(LiveTask)
class LiveTaskAdmin(admin.ModelAdmin):
    """Hosts the live views: its changelist is the dashboard; the model has no table.

    `view_livetask` lets staff look, `change_livetask` lets them act (and look): the names of
    `django_rtq.permissions`, which the API checks too.
    """

    def get_urls(self) -> list[URLPattern]:
        return live_urlpatterns(self)  # none of the default views: there are no rows

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return Operations(request.user).allows(VIEW_LIVE)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return Operations(request.user).allows(CHANGE_LIVE)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(FinishedTask)
class FinishedTaskAdmin(admin.ModelAdmin):
    """The ORM mirror of finished tasks, read only."""

    list_display = ("task_id", "task_name", "queue", "status", "attempts", "finished_at", "duration")
    list_filter = ("status", "queue", "task_name")
    search_fields = ("=task_id", "task_name")
    date_hierarchy = "finished_at"
    show_full_result_count = False  # a COUNT(*) of a big table per page is not worth it
    fields = (
        "task_id",
        "task_name",
        "queue",
        "status",
        "args_json",
        "kwargs_json",
        "priority",
        "return_value_json",
        "error_class",
        "error_message",
        "traceback_text",
        "errors_json",
        "attempts",
        "worker",
        "workers",
        "enqueued_at",
        "started_at",
        "finished_at",
        "duration",
        "parent_id",
    )
    readonly_fields = fields
    change_form_template = "admin/django_rtq/finishedtask/change_form.html"

    # JSON pretty-printed and tracebacks as written, in a <pre> with a copy button: Django would
    # show them on one line, and turn the traceback's indentation into collapsed spaces.
    @admin.display(description="arguments")
    def args_json(self, obj: FinishedTask) -> SafeString:
        return rtq_json(obj.args)

    @admin.display(description="keyword arguments")
    def kwargs_json(self, obj: FinishedTask) -> SafeString:
        return rtq_json(obj.kwargs)

    @admin.display(description="return value")
    def return_value_json(self, obj: FinishedTask) -> SafeString:
        return rtq_json(obj.return_value)

    @admin.display(description="traceback")
    def traceback_text(self, obj: FinishedTask) -> SafeString | str:
        return rtq_pre(obj.traceback) if obj.traceback else "-"

    @admin.display(description="errors of each attempt")
    def errors_json(self, obj: FinishedTask) -> SafeString | str:
        return rtq_json(obj.errors) if obj.errors else "-"

    def get_queryset(self, request: HttpRequest) -> QuerySet[FinishedTask]:
        # From the mirror's database (RTQ["MIRROR_DATABASE"]), as every surface reads history.
        return Operations(request.user).finished_tasks()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ):
        return super().change_view(
            request,
            object_id,
            form_url,
            {**self.live_task_context(request, object_id), **(extra_context or {})},
        )

    def live_task_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        """Link to the live task page while the task is still in Redis (the detail page only)."""
        try:
            live_admin = self.admin_site.get_model_admin(LiveTask)
        except admin.sites.NotRegistered:
            return {}
        obj = self.get_object(request, unquote(object_id))
        if obj is None or not live_admin.has_view_permission(request):
            return {}
        try:
            task = Operations(request.user).live_task(obj.task_id, queue=obj.queue)
        except TaskNotFound:
            return {"live_task_note": "This task is no longer in Redis."}
        except BrokerUnavailable:
            return {"live_task_note": "Redis is unreachable: whether the task is still there is unknown."}
        return {"live_task_url": task_url(live_admin, task.id, task.queue), "live_task_state": task.state}

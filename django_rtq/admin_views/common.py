"""What the live views share: permissions and the operations layer, page context, Redis errors, URLs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlencode

from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from ..broker import TaskState
from ..broker.waiting import WaitingKind
from ..exceptions import BrokerUnavailable
from ..operations import Operations

#: The states in the order the admin shows them: the lifecycle's, then any others.
_ORDER = ("pending", "active", "scheduled", "retry", "archived", "completed")
STATES = tuple(sorted(TaskState, key=lambda s: _ORDER.index(s) if s in _ORDER else len(_ORDER)))
#: What the time kept with a task (its score) means in each state.
STATE_TIME_LABELS = {
    TaskState.SCHEDULED: "Runs at",
    TaskState.RETRY: "Next attempt",
    TaskState.ACTIVE: "Lease expires",
    TaskState.ARCHIVED: "Archived at",
    TaskState.COMPLETED: "Kept until",
}

View = Callable[..., HttpResponse]


def live_view(*, acts: bool = False) -> Callable[[View], View]:
    """Check the permission (view, or change if the view `acts`) and turn Redis errors into a page.

    The view is called as `view(request, model_admin, ops, ...)`, `ops` being the operations
    layer as the request's user (which checks each call's permission again).
    """

    def decorator(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, model_admin: ModelAdmin, *args: Any, **kwargs: Any) -> HttpResponse:
            allowed = (
                model_admin.has_change_permission(request)
                if acts
                else model_admin.has_view_permission(request)
            )
            if not allowed:
                raise PermissionDenied
            ops = Operations(request.user)
            try:
                return view(request, model_admin, ops, *args, **kwargs)
            except BrokerUnavailable as exc:
                context = page_context(request, model_admin, title="Redis is unreachable")
                context["error"] = str(exc)
                context["outbox"] = outbox_while_redis_is_away(model_admin, ops)
                return TemplateResponse(request, "admin/django_rtq/unavailable.html", context, status=503)

        return wrapper

    return decorator


def outbox_while_redis_is_away(model_admin: ModelAdmin, ops: Operations) -> dict[str, Any] | None:
    """What the outbox holds, for the page that says Redis is away (when it fills); None if its
    database cannot be read either."""
    try:
        stats = ops.outbox_stats()
    except DatabaseError:
        return None
    return {"waiting": stats.waiting, "url": admin_url(model_admin, "outbox")}


def page_context(
    request: HttpRequest, model_admin: ModelAdmin, *, title: str, **extra: Any
) -> dict[str, Any]:
    """The admin's own context (site header, sidebar, ...) plus what every live page uses."""
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "app_label": model_admin.model._meta.app_label,
        "can_change": model_admin.has_change_permission(request),
        "states": STATES,
        **extra,
    }


def admin_url(model_admin: ModelAdmin, name: str, *args: Any, query: dict[str, Any] | None = None) -> str:
    """Reverse one of the live views (`dashboard`, `tasks`, `task`, `task_action`, `queue_action`,
    `bulk`, `bulk_carry_on`)."""
    url = reverse(f"{model_admin.admin_site.name}:{url_name(name)}", args=args)
    present = {key: value for key, value in (query or {}).items() if value not in (None, "")}
    return f"{url}?{urlencode(present)}" if present else url


def waiting_group(model_admin: ModelAdmin, queue: str, kinds: list[WaitingKind]) -> dict[str, Any]:
    """A queue's kinds of tasks waiting for a worker that can run them, with where to see them: the
    pending list read from its end, where they wait after every task that can run."""
    return {
        "queue": queue,
        "kinds": kinds,
        "pending_url": admin_url(
            model_admin, "tasks", TaskState.PENDING, query={"queue": queue, "order": "reverse"}
        ),
    }


def url_name(name: str) -> str:
    return "django_rtq_livetask_changelist" if name == "dashboard" else f"django_rtq_{name}"


class SegmentConverter:
    """A task id or a queue name in a URL, as one path segment that is never "." or "..".

    Ids stored before ids were checked may hold "/", "%" or be "..", and queue names may hold
    "/": `to_url` quotes them all (and reverse() quotes the "%"), so that a link to the task
    page of `../../auth/user/` stays a link to that task page, not one a browser resolves to
    another admin page. `to_python` unquotes, so a hand-written task/reports/2026/ still finds
    "reports/2026".
    """

    regex = ".+"

    def to_python(self, value: str) -> str:
        return unquote(value)

    def to_url(self, value: str) -> str:
        quoted = quote(value, safe="")
        return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def task_url(model_admin: ModelAdmin, task_id: str, queue: str | None = None) -> str:
    return admin_url(model_admin, "task", task_id, query={"queue": queue})


def safe_next(request: HttpRequest, fallback: str) -> str:
    """The `next` URL of the request if it points to this site, else `fallback`."""
    target = request.POST.get("next") or request.GET.get("next")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return fallback

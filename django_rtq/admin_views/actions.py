"""Acting by hand: run now, archive, delete, cancel tasks; pause and resume queues.

Every action is a POST that first shows a confirmation page, then a second POST (with
`confirm=yes`) acts, leaves a `messages` note saying what happened and redirects back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from ..broker import TaskState
from ..broker.inspect import Inspector
from ..exceptions import InvalidStateTransition
from .common import admin_url, live_view, page_context, plural, queue_names, safe_next, task_url

#: Tasks named on a confirmation page; more are counted, not listed.
CONFIRM_LISTED = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskAction:
    """An action on tasks as the admin offers it."""

    name: str  # the form value
    label: str  # the button
    done: str  # what happened to the tasks, after "3 tasks"
    bulk: bool = True  # offered for every task in a state of a queue

    def act(self, inspector: Inspector, queue: str, task_ids: list[str]) -> int:
        if self.name == "cancel":
            return sum(1 for task_id in task_ids if inspector.cancel(task_id))
        method = {"run": inspector.run_now, "archive": inspector.archive, "delete": inspector.delete}
        return method[self.name](queue, task_ids)

    def act_all(self, inspector: Inspector, queue: str, state: TaskState) -> int:
        method = {"run": inspector.run_all, "archive": inspector.archive_all, "delete": inspector.delete_all}
        return method[self.name](queue, state)


ACTIONS = {
    action.name: action
    for action in (
        TaskAction(name="run", label="Run now", done="moved to pending"),
        TaskAction(name="archive", label="Archive", done="archived"),
        TaskAction(name="delete", label="Delete", done="deleted"),
        TaskAction(name="cancel", label="Cancel", done="asked to stop", bulk=False),
    )
}
#: The actions each state allows (the inspector's rules: nothing but cancel touches active tasks).
STATE_ACTIONS: dict[TaskState, tuple[str, ...]] = {
    TaskState.SCHEDULED: ("run", "archive", "delete"),
    TaskState.RETRY: ("run", "archive", "delete"),
    TaskState.ARCHIVED: ("run", "delete"),
    TaskState.PENDING: ("archive", "delete"),
    TaskState.COMPLETED: ("delete",),
    TaskState.ACTIVE: ("cancel",),
    TaskState.WAITING: ("cancel", "delete"),  # a workflow: cancelling archives it at once
}


@require_POST
@live_view(acts=True)
def task_action(request: HttpRequest, model_admin: ModelAdmin, inspector: Inspector) -> HttpResponse:
    data = request.POST
    queue, action_name, scope = data.get("queue", ""), data.get("action", ""), data.get("scope", "selected")
    task_ids = list(dict.fromkeys(data.getlist("ids")))
    try:
        state = TaskState(data.get("state", ""))
    except ValueError:
        state = None
    back = safe_next(
        request, admin_url(model_admin, "tasks", state or TaskState.PENDING, query={"queue": queue})
    )
    if queue not in queue_names(inspector) or state is None:
        messages.error(request, "Unknown queue or state.")
        return HttpResponseRedirect(back)
    action = ACTIONS.get(action_name)
    if action is None or action_name not in STATE_ACTIONS.get(state, ()):
        messages.error(request, f"That action does not apply to {state} tasks.")
        return HttpResponseRedirect(back)
    if scope == "all" and not action.bulk:
        messages.error(request, f"{action.label} applies to selected tasks only.")
        return HttpResponseRedirect(back)
    if scope != "all" and not task_ids:
        messages.warning(request, "Select tasks first: nothing was done.")
        return HttpResponseRedirect(back)

    if data.get("confirm") != "yes":
        everything = scope == "all"
        count = inspector.count(queue, state) if everything else len(task_ids)
        what = f"all {plural(count, f'{state} task')}" if everything else plural(count, "selected task")
        context = page_context(
            request,
            model_admin,
            title="Are you sure?",
            question=f"{action.label}: {what} of queue {queue!r}?",
            listed=[]
            if everything
            else [(task_id, task_url(model_admin, task_id, queue)) for task_id in task_ids[:CONFIRM_LISTED]],
            unlisted=0 if everything else max(0, len(task_ids) - CONFIRM_LISTED),
            hidden=[
                ("action", action.name),
                ("queue", queue),
                ("state", state),
                ("scope", "all" if everything else "selected"),
                ("next", back),
                *(() if everything else (("ids", task_id) for task_id in task_ids)),
            ],
            confirm_label=f"Yes, {action.label.lower()}",
            post_url=request.path,
            back=back,
        )
        return TemplateResponse(request, "admin/django_rtq/confirm.html", context)

    if scope == "all":
        count = action.act_all(inspector, queue, state)
        messages.success(request, f"{plural(count, f'{state} task')} of queue {queue!r} {action.done}.")
        return HttpResponseRedirect(back)
    try:
        count = action.act(inspector, queue, task_ids)
    except InvalidStateTransition as exc:  # say, running a finished workflow again
        messages.error(request, str(exc))
        return HttpResponseRedirect(back)
    if action.name == "cancel":
        report_cancel(request, task_ids, count)
    else:
        messages.success(request, f"{plural(count, 'task')} of queue {queue!r} {action.done}.")
        if count < len(task_ids):
            messages.warning(
                request,
                f"{plural(len(task_ids) - count, 'selected task')} skipped: no longer {state} "
                f"(or gone) by the time the action ran.",
            )
    return HttpResponseRedirect(back)


def report_cancel(request: HttpRequest, task_ids: list[str], reached: int) -> None:
    if reached:
        messages.success(
            request,
            f"Cancellation of {plural(reached, 'task')} requested: a running task is stopped by its "
            "worker, a waiting workflow at once; either ends archived.",
        )
    if reached < len(task_ids):
        messages.warning(
            request,
            f"{plural(len(task_ids) - reached, 'cancellation')} reached no worker: no worker is "
            "listening now, or the task had finished. An active task whose worker died is "
            "recovered when its lease expires.",
        )


@require_POST
@live_view(acts=True)
def queue_action(request: HttpRequest, model_admin: ModelAdmin, inspector: Inspector) -> HttpResponse:
    queue, action = request.POST.get("queue", ""), request.POST.get("action", "")
    back = safe_next(request, admin_url(model_admin, "dashboard"))
    if queue not in queue_names(inspector) or action not in ("pause", "resume"):
        messages.error(request, "Unknown queue or action.")
        return HttpResponseRedirect(back)
    if request.POST.get("confirm") != "yes":
        effect = (
            "Workers stop claiming its tasks; running tasks finish, and enqueueing goes on."
            if action == "pause"
            else "Workers claim its pending tasks again."
        )
        context: dict[str, Any] = page_context(
            request,
            model_admin,
            title="Are you sure?",
            question=f"{action.capitalize()} queue {queue!r}? {effect}",
            listed=[],
            unlisted=0,
            hidden=[("action", action), ("queue", queue), ("next", back)],
            confirm_label=f"Yes, {action}",
            post_url=request.path,
            back=back,
        )
        return TemplateResponse(request, "admin/django_rtq/confirm.html", context)
    paused = inspector.broker.is_paused(queue)
    if action == "pause" and not paused:
        inspector.pause(queue)
        messages.success(request, f"Queue {queue!r} paused.")
    elif action == "resume" and paused:
        inspector.resume(queue)
        messages.success(request, f"Queue {queue!r} resumed.")
    else:
        messages.info(request, f"Queue {queue!r} was already {'paused' if paused else 'running'}.")
    return HttpResponseRedirect(back)

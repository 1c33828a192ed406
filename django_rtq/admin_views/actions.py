"""Acting by hand: run now, archive, delete, cancel tasks; pause, resume and empty queues.

Every action is a POST that first shows a confirmation page, then a second POST (with
`confirm=yes`) acts through the operations layer. A list's per-row buttons post `row`
(`<action>:<task id>`), read as that action on that one selected task. An action on selected tasks leaves a
`messages` note saying what happened and redirects back; an action on a whole state (or
emptying a queue) starts a bulk job and redirects to its progress page.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.views.decorators.http import require_POST

from ..broker import TaskState
from ..broker.bulk import PURGE_STATES
from ..broker.states import BULK_ACTIONS, Action, ActionNotAllowed, actions_for, check_action
from ..formats import plural
from ..operations import DONE, ActionReport, Operations
from .common import admin_url, live_view, page_context, safe_next, task_url

#: Tasks named on a confirmation page, and in a message; more are counted, not listed.
CONFIRM_LISTED = 100
MESSAGE_LISTED = 5
#: How the admin names each action (its buttons and choices).
LABELS = {
    Action.RUN: "Run now",
    Action.ARCHIVE: "Archive",
    Action.DELETE: "Delete",
    Action.CANCEL: "Cancel",
}
#: The queue actions of the dashboard: what each does, for its confirmation page.
QUEUE_ACTIONS = {
    "pause": "Workers stop claiming its tasks; running tasks finish, and enqueueing goes on.",
    "resume": "Workers claim its pending tasks again.",
    "purge": "Active tasks are left to their workers.",
}
#: What a queue action did, for its message.
QUEUE_DONE = {"pause": "paused", "resume": "resumed"}


@dataclass(frozen=True, slots=True)
class Offer:
    """An action as a page offers it: the form value and the label."""

    action: Action
    label: str


def offers(state: TaskState, *, bulk: bool = False) -> list[Offer]:
    """The actions a task in `state` allows (only those for a whole state, if `bulk`)."""
    return [
        Offer(action, LABELS[action]) for action in actions_for(state) if not bulk or action in BULK_ACTIONS
    ]


@require_POST
@live_view(acts=True)
def task_action(request: HttpRequest, model_admin: ModelAdmin, ops: Operations) -> HttpResponse:
    data = request.POST.copy()
    if data.get("row"):  # a row's own button: "<action>:<task id>", the same path as a selection
        action_name, _, row_id = data.pop("row")[-1].partition(":")
        data.setlist("action", [action_name])
        data.setlist("ids", [row_id])
        data.setlist("scope", ["selected"])
    queue, scope = data.get("queue", ""), data.get("scope", "selected")
    task_ids = list(dict.fromkeys(data.getlist("ids")))
    try:
        state = TaskState(data.get("state", ""))
    except ValueError:
        state = None
    back = safe_next(
        request, admin_url(model_admin, "tasks", state or TaskState.PENDING, query={"queue": queue})
    )
    if queue not in ops.queues() or state is None:
        messages.error(request, "Unknown queue or state.")
        return HttpResponseRedirect(back)
    try:
        action = Action(data.get("action", ""))
        check_action(action, state)
    except (ValueError, ActionNotAllowed):
        messages.error(request, f"That action does not apply to {state} tasks.")
        return HttpResponseRedirect(back)
    everything = scope == "all"
    if everything and action not in BULK_ACTIONS:
        messages.error(request, f"{LABELS[action]} applies to selected tasks only.")
        return HttpResponseRedirect(back)
    if not everything and not task_ids:
        messages.warning(request, "Select tasks first: nothing was done.")
        return HttpResponseRedirect(back)
    # "Run again" narrowed: every task of the state of one type, whose last error is of one class
    narrowing = {name: data.get(name, "").strip() for name in ("task_name", "error_class")}
    narrowed = any(narrowing.values())
    if narrowed and not (everything and action == Action.RUN):
        messages.error(request, "Only a run of a whole state can be narrowed to a task type or an error.")
        return HttpResponseRedirect(back)

    if data.get("confirm") != "yes":
        if narrowed:
            count = ops.count_matching(queue, state, **narrowing)
            what = f"all {plural(count, f'{state} task')} {describe_narrowing(**narrowing)}"
        else:
            count = ops.count(queue, state) if everything else len(task_ids)
            what = f"all {plural(count, f'{state} task')}" if everything else plural(count, "selected task")
        listed = [] if everything else task_ids
        return confirmation(
            request,
            model_admin,
            question=f"{LABELS[action]}: {what} of queue {queue!r}?",
            listed=[(task_id, task_url(model_admin, task_id, queue)) for task_id in listed[:CONFIRM_LISTED]],
            unlisted=max(0, len(listed) - CONFIRM_LISTED),
            hidden=[
                ("action", action),
                ("queue", queue),
                ("state", state),
                ("scope", "all" if everything else "selected"),
                ("next", back),
                *((name, value) for name, value in narrowing.items() if value),
                *(("ids", task_id) for task_id in listed),
            ],
            confirm_label=f"Yes, {LABELS[action].lower()}",
            back=back,
        )

    if everything:
        job = ops.start_bulk(action, queue, [state], **narrowing)
        return HttpResponseRedirect(admin_url(model_admin, "bulk", queue, job.id))
    report = ops.act(action, task_ids, queue)
    if action == Action.CANCEL:
        report_cancel(request, report, queue)
    else:
        report_action(request, report, queue)
    return HttpResponseRedirect(back)


def describe_narrowing(*, task_name: str = "", error_class: str = "") -> str:
    """Which tasks a narrowed run takes: "of type shop.tasks.pay whose last error is a KeyError"."""
    parts = []
    if task_name:
        parts.append(f"of type {task_name}")
    if error_class:
        parts.append(f"whose last error is a {error_class}")
    return " ".join(parts)


def report_action(request: HttpRequest, report: ActionReport, queue: str) -> None:
    """Say what an action on selected tasks did, and why it left some alone."""
    done = DONE[report.action]
    if report.count:
        messages.success(request, f"{plural(report.count, 'task')} of queue {queue!r} {done}.")
    report_skipped(request, report)
    if report.changed_meanwhile:
        messages.warning(
            request,
            f"{plural(report.changed_meanwhile, 'selected task')} left alone: no longer in a state "
            f"{report.action} applies to (or gone) by the time the action ran.",
        )
    report_missing(request, report, queue)


def report_cancel(request: HttpRequest, report: ActionReport, queue: str) -> None:
    if report.count:
        messages.success(
            request,
            f"Cancellation of {plural(report.count, 'task')} requested: a running task is stopped by "
            "its worker, a waiting workflow at once; either ends archived.",
        )
    report_skipped(request, report)
    if report.changed_meanwhile:
        messages.warning(
            request,
            f"{plural(report.changed_meanwhile, 'cancellation')} reached no worker: no worker is "
            "listening now, or the task had finished. An active task whose worker died is "
            "recovered when its lease expires.",
        )
    report_missing(request, report, queue)


def report_skipped(request: HttpRequest, report: ActionReport) -> None:
    """One message per reason the action left tasks alone (their state, or being a workflow)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for ref, reason in report.skipped:
        by_reason[reason].append(ref.id)
    done = DONE[report.action]
    for reason, ids in by_reason.items():
        if len(ids) == 1:
            messages.warning(request, f"Task {ids[0]!r} was not {done}: {reason}.")
        else:
            messages.warning(
                request,
                f"{plural(len(ids), 'selected task')} were not {done} ({listing(ids)}); each: {reason}.",
            )


def report_missing(request: HttpRequest, report: ActionReport, queue: str) -> None:
    if report.missing:
        messages.warning(
            request,
            f"{plural(len(report.missing), 'selected task')} no longer in queue {queue!r} "
            f"({listing(report.missing)}): deleted, or gone at the end of its retention.",
        )


def listing(ids: list[str]) -> str:
    """A few ids, quoted, and how many more."""
    shown = ", ".join(repr(task_id) for task_id in ids[:MESSAGE_LISTED])
    return shown + (f" and {len(ids) - MESSAGE_LISTED:,} more" if len(ids) > MESSAGE_LISTED else "")


@require_POST
@live_view(acts=True)
def queue_action(request: HttpRequest, model_admin: ModelAdmin, ops: Operations) -> HttpResponse:
    queue, action = request.POST.get("queue", ""), request.POST.get("action", "")
    back = safe_next(request, admin_url(model_admin, "dashboard"))
    if queue not in ops.queues() or action not in QUEUE_ACTIONS:
        messages.error(request, "Unknown queue or action.")
        return HttpResponseRedirect(back)
    if request.POST.get("confirm") != "yes":
        if action == "purge":
            count = sum(ops.count(queue, state) for state in PURGE_STATES)
            question = (
                f"Empty queue {queue!r}? Its {plural(count, 'task')} in the states "
                f"{', '.join(PURGE_STATES)} will be deleted. {QUEUE_ACTIONS[action]}"
            )
            label = "Yes, empty it"
        else:
            question = f"{action.capitalize()} queue {queue!r}? {QUEUE_ACTIONS[action]}"
            label = f"Yes, {action}"
        return confirmation(
            request,
            model_admin,
            question=question,
            hidden=[("action", action), ("queue", queue), ("next", back)],
            confirm_label=label,
            back=back,
        )
    if action == "purge":
        job = ops.purge(queue)
        return HttpResponseRedirect(admin_url(model_admin, "bulk", queue, job.id))
    changed = ops.pause(queue) if action == "pause" else ops.resume(queue)
    if changed:
        messages.success(request, f"Queue {queue!r} {QUEUE_DONE[action]}.")
    else:
        messages.info(request, f"Queue {queue!r} was already {'paused' if action == 'pause' else 'running'}.")
    return HttpResponseRedirect(back)


def confirmation(
    request: HttpRequest,
    model_admin: ModelAdmin,
    *,
    question: str,
    hidden: list[tuple[str, Any]],
    confirm_label: str,
    back: str,
    listed: list[tuple[str, str]] | None = None,
    unlisted: int = 0,
    changes: list[tuple[str, str, str]] | None = None,
) -> HttpResponse:
    """The page that asks before acting: its form posts the same data again, with confirm=yes.
    `changes` are (what, before, after) rows: an edit's old and new arguments."""
    context = page_context(
        request,
        model_admin,
        title="Are you sure?",
        question=question,
        listed=listed or [],
        unlisted=unlisted,
        changes=changes or [],
        hidden=hidden,
        confirm_label=confirm_label,
        post_url=request.path,
        back=back,
    )
    return TemplateResponse(request, "admin/django_rtq/confirm.html", context)

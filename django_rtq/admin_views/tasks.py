"""Task lists per state, a page at a time straight from Redis, and the page of one task."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.contrib.admin.utils import quote
from django.core.paginator import Paginator
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse

from ..broker import TaskState
from ..broker.attempt import AttemptInfo
from ..broker.inspect import NAME_SEARCH_SCAN, TaskInfo
from ..broker.message import OPTION_FIELDS
from ..broker.states import EDIT_STATES, Action
from ..broker.waiting import WaitingKind
from ..exceptions import TaskNotFound
from ..formats import django_datetime, format_duration
from ..models import TaskEdit
from ..operations import Operations
from ..permissions import EDIT_ARGUMENTS, VIEW_HISTORY
from ..registry import registered_tasks
from ..task_view import TaskView, view_of_live_task
from .actions import offers
from .common import STATE_TIME_LABELS, STATES, admin_url, live_view, page_context, task_url, waiting_group

#: Tasks per page of a list, by default, and the sizes one may choose (`?per_page=`).
PER_PAGE = 50
PAGE_SIZES = (20, 50, 100, 500)
#: How each state's list is ordered (its sorted set read forwards), and the other way round
#: (`?order=reverse`): both are one ZRANGE, from either end.
ORDER_LABELS = {
    TaskState.PENDING: ("next to run first", "last to run first"),
    TaskState.ACTIVE: ("lease ending first", "lease ending last"),
    TaskState.SCHEDULED: ("soonest first", "latest first"),
    TaskState.RETRY: ("soonest first", "latest first"),
    TaskState.ARCHIVED: ("newest first", "oldest first"),
    TaskState.COMPLETED: ("newest first", "oldest first"),
}
#: Message options holding epoch seconds, and those holding lengths of time (seconds).
TIME_OPTIONS = ("deadline", "enqueued_at", "process_at")
SECONDS_OPTIONS = ("timeout", "retention", "unique_ttl", "debounce")
#: Info entries the task page shows on their own rather than in the attempt facts.
INFO_SHOWN_APART = (
    "retried",
    "error",
    "error_type",
    "traceback",
    "errors",
    "workers",
    "progress",
    "children",
    "checkpoint",
    "checkpointed_at",
)


#: Attempt facts (a task's info) in words; others read as their key in words.
FACT_LABELS = {
    "started_at": "First attempt started",
    "attempted_at": "Latest attempt started",
    "claimed_at": "Claimed",
    "finished_at": "Finished",
    "failed_at": "Failed",
    "retry_at": "Next attempt",
    "worker": "Worker of the latest attempt",
    "recovered": "Taken back from a lost worker (times)",
    "requeued": "Returned unstarted (times)",
}
#: A waiting workflow's facts in words; `queue:<position>` reads "Child <position> runs in queue".
WORKFLOW_LABELS = {
    "kind": "Kind",
    "stage": "Stage",
    "n": "Children",
    "made": "Children made so far",
    "done": "Children finished",
    "created": "Created",
    "start_at": "Starts",
    "retention": "Kept after it ends",
    "queue": "Queue",
    "on_error": "When a child fails",
    "parent": "Parent workflow",
    "parent_queue": "Parent's queue",
    "position": "Position in its parent",
    "driving": "Asking for more children",
    "exhausted": "No more children to come",
    "state": "Iterator state",
}
#: Workflow facts holding epoch milliseconds, and lengths of time in milliseconds.
WORKFLOW_MS_TIMES = ("created", "start_at")
WORKFLOW_MS_LENGTHS = ("retention",)


def in_words(key: str) -> str:
    """`max_retries` -> `Max retries`."""
    return key.replace("_", " ").strip().capitalize()


class TaskList:
    """A queue's tasks in one state as a sequence Django's Paginator can page through.

    Its length is one ZCARD (or the count the caller already has) and a slice is one ZRANGE
    with offsets, so a page costs the same whether the list holds ten tasks or millions.
    """

    def __init__(
        self,
        ops: Operations,
        queue: str,
        state: TaskState,
        *,
        total: int | None = None,
        reverse: bool = False,
    ) -> None:
        self.ops = ops
        self.queue = queue
        self.state = state
        self.total = total
        self.reverse = reverse

    def count(self) -> int:
        return self.total if self.total is not None else self.ops.count(self.queue, self.state)

    def __getitem__(self, bounds: slice) -> list[TaskInfo]:
        start, stop = bounds.start or 0, bounds.stop
        return self.ops.list_tasks(
            self.queue, self.state, offset=start, limit=max(stop - start, 0), reverse=self.reverse
        )


@live_view()
def task_list(request: HttpRequest, model_admin: ModelAdmin, ops: Operations, state: str) -> HttpResponse:
    try:
        task_state = TaskState(state)
    except ValueError:
        raise Http404(f"No state {state!r}.") from None
    names = ops.queues()
    counts = {name: ops.count(name, task_state) for name in names}
    queue = request.GET.get("queue")
    if queue not in counts:
        queue = next((name for name in names if counts[name]), names[0])

    task_id = request.GET.get("id", "").strip()
    if task_id:
        try:
            found = ops.live_task(task_id)
        except TaskNotFound:
            messages.warning(request, f"No task with id {task_id!r} in any queue.")
        else:
            return HttpResponseRedirect(task_url(model_admin, found.id, found.queue))

    name = request.GET.get("name", "").strip()
    partition = request.GET.get("partition", "").strip()
    searching = bool(name or partition)
    per_page = page_size(request.GET.get("per_page"))
    orders = ORDER_LABELS.get(task_state, ("oldest first", "newest first"))
    reverse = request.GET.get("order") == "reverse"
    if searching:
        object_list: Any = ops.search_by_name(
            queue, task_state, name, partition=partition or None, scan=NAME_SEARCH_SCAN
        )
    else:
        object_list = TaskList(ops, queue, task_state, total=counts[queue], reverse=reverse)
    page = Paginator(object_list, per_page).get_page(request.GET.get("page"))
    base_query = {
        "queue": queue,
        "name": name,
        "partition": partition,
        "per_page": per_page if per_page != PER_PAGE else None,
        "order": "reverse" if reverse else None,
    }

    context = page_context(
        request,
        model_admin,
        title=f"{task_state.capitalize()} tasks",
        subtitle=f"Queue {queue}",
        state=task_state,
        queue=queue,
        queue_filter=[
            (
                queue_name,
                counts[queue_name],
                admin_url(model_admin, "tasks", task_state, query={"queue": queue_name}),
            )
            for queue_name in names
        ],
        state_tabs=[
            (other, admin_url(model_admin, "tasks", other, query={"queue": queue})) for other in STATES
        ],
        total=counts[queue],
        waiting_for_worker=waiting_group(model_admin, queue, ops.waiting_for_worker(queue)),
        name=name,
        partition=partition,
        searching=searching,
        task_id=task_id,
        scan_limit=NAME_SEARCH_SCAN,
        page=page,
        page_links=[
            (number, admin_url(model_admin, "tasks", task_state, query={**base_query, "page": number}))
            if isinstance(number, int)
            else (number, None)
            for number in page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1)
        ],
        rows=[task_row(model_admin, view_of_live_task(task)) for task in page.object_list],
        page_sizes=[
            (
                size,
                size == per_page,
                admin_url(model_admin, "tasks", task_state, query={**base_query, "per_page": size}),
            )
            for size in PAGE_SIZES
        ],
        orders=[
            (
                label,
                is_reverse == reverse,
                admin_url(
                    model_admin,
                    "tasks",
                    task_state,
                    query={**base_query, "order": "reverse" if is_reverse else None},
                ),
            )
            for label, is_reverse in zip(orders, (False, True), strict=True)
        ]
        if not searching
        else [],
        can_empty=Action.DELETE in [offer.action for offer in offers(task_state, bulk=True)],
        time_label=STATE_TIME_LABELS.get(task_state),
        actions=offers(task_state),
        bulk_actions=offers(task_state, bulk=True),
        run_again={"task_types": sorted(registered_tasks())}
        if task_state == TaskState.ARCHIVED and model_admin.has_change_permission(request)
        else None,
        action_url=admin_url(model_admin, "task_action"),
        here=request.get_full_path(),
    )
    return TemplateResponse(request, "admin/django_rtq/task_list.html", context)


def waiting_of(ops: Operations, task: TaskView) -> list[WaitingKind]:
    """The kind a task waiting for a worker that can run it is of (all the queue's kinds when its
    message cannot be read, which a newer stored format may be); none for any other task."""
    if not task.waits_for_worker:
        return []
    return [kind for kind in ops.waiting_for_worker(task.queue) if task.task in (None, kind.task)]


def page_size(asked: str | None) -> int:
    """The page size asked for if it is one of PAGE_SIZES, else the default."""
    try:
        size = int(asked or PER_PAGE)
    except ValueError:
        return PER_PAGE
    return size if size in PAGE_SIZES else PER_PAGE


def task_row(model_admin: ModelAdmin, task: TaskView) -> dict[str, Any]:
    message = task.message
    return {
        "id": task.id,
        "url": task_url(model_admin, task.id, task.queue),
        "task": task.task,
        "arguments": [message.args, message.kwargs] if message else None,
        "priority": message.priority if message else None,
        "enqueued_at": django_datetime(message.enqueued_at) if message else None,
        "retried": task.retried,
        "error": shorten(task.error, ERROR_SHOWN),
        "at": django_datetime(task.score_at),
        "owner": task.owner,
        "held": task.held,
        "waits_for_worker": task.waits_for_worker,
        "actions": offers(task.state),
    }


#: Longest error a list cell carries (in full on hover); the task page shows it all.
ERROR_SHOWN = 2000


def shorten(text: str | None, width: int = 80) -> str | None:
    if text is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


@live_view()
def task_detail(request: HttpRequest, model_admin: ModelAdmin, ops: Operations, task_id: str) -> HttpResponse:
    queue = request.GET.get("queue") or None
    try:
        found = ops.live_task(task_id, queue=queue)
    except TaskNotFound:
        if queue is None:
            return not_found(request, model_admin, ops, task_id)
        try:  # the queue in the link may be stale; the id is enough
            found = ops.live_task(task_id)
        except TaskNotFound:
            return not_found(request, model_admin, ops, task_id)
    task = view_of_live_task(found, ops.held_reason(found) if found.held else None)
    message = task.message
    context = page_context(
        request,
        model_admin,
        title=f"Task {task.id}",
        subtitle=message.task if message else "Corrupt message",
        task=task,
        message=message,
        held_reason=task.held_back,
        waiting_for_worker=waiting_group(model_admin, task.queue, waiting_of(ops, task)),
        list_url=admin_url(model_admin, "tasks", task.state, query={"queue": task.queue}),
        time_label=STATE_TIME_LABELS.get(task.state),
        at=django_datetime(task.score_at),
        options=task_options(message) if message else [],
        facts=[
            (FACT_LABELS.get(key) or in_words(key), read_fact(key, value))
            for key, value in task.attempt.as_dict().items()
            if key not in INFO_SHOWN_APART
        ],
        attempts=read_attempts(task.attempt),
        error_type=task.error_type,
        traceback=task.traceback,
        has_result=task.result is not None,
        # a workflow's progress: its own column, or (workflows) its finished children
        progress=read_progress(task.progress),
        checkpoint=json.dumps(task.checkpoint, ensure_ascii=False) if task.checkpointed_at else None,
        parent_url=task_url(model_admin, message.parent, message.parent_queue)
        if message and message.parent
        else None,
        # a waiting workflow's running children, or those its info lists
        children=read_children(model_admin, task.children),
        workflow=workflow_facts(task.workflow or {}),
        actions=offers(task.state),
        action_url=admin_url(model_admin, "task_action"),
        here=request.get_full_path(),
        edit_url=admin_url(model_admin, "task_edit", task.id, query={"queue": task.queue})
        if task.state in EDIT_STATES and message and ops.allows(EDIT_ARGUMENTS)
        else None,
        # "run again" every archived task like this one: its type, and its last error's class
        run_again_like=task.state == TaskState.ARCHIVED and message is not None,
        edits=task_history(ops, task.id),
    )
    return TemplateResponse(request, "admin/django_rtq/task_detail.html", context)


def task_options(message: Any) -> list[tuple[str, Any]]:
    options = []
    for name in OPTION_FIELDS:
        value = getattr(message, name)
        if name in TIME_OPTIONS:
            value = django_datetime(value) if value else None
        elif name in SECONDS_OPTIONS and value is not None:
            value = format_duration(value)
        options.append((in_words(name), value))
    return options


def workflow_facts(workflow: dict[str, Any]) -> list[tuple[str, Any]]:
    """A waiting workflow's facts in words, times as datetimes, the children's queues last."""
    facts, children = [], []
    for key, value in sorted(workflow.items()):
        if key.startswith("queue:"):
            children.append((f"Child {key[6:]} runs in queue", value))
        elif key in WORKFLOW_MS_TIMES and isinstance(value, int | float):
            facts.append((WORKFLOW_LABELS[key], django_datetime(value / 1000)))
        elif key in WORKFLOW_MS_LENGTHS and isinstance(value, int | float):
            facts.append((WORKFLOW_LABELS[key], format_duration(value / 1000)))
        else:
            facts.append((WORKFLOW_LABELS.get(key) or in_words(key), value))
    return facts + children


def read_fact(key: str, value: Any) -> Any:
    """An attempt fact for display: times as datetimes, lists and objects as JSON."""
    if key.endswith("_at") and (moment := django_datetime(value)):
        return moment
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return value


def read_attempts(attempt: AttemptInfo) -> list[dict[str, Any]]:
    """One row per attempt: its worker and, if it failed, its error (`workers` and `errors` lists)."""
    workers, errors = attempt.workers, attempt.errors
    return [
        {
            "number": n + 1,
            "worker": workers[n] if n < len(workers) else None,
            "error": errors[n] if n < len(errors) and isinstance(errors[n], dict) else None,
        }
        for n in range(max(len(workers), len(errors)))
    ]


def read_progress(progress: Any) -> dict[str, Any] | None:
    """Read {"done": n, "total": m}; None when absent or not numbers."""
    if not isinstance(progress, dict):
        return None
    done, total = progress.get("done"), progress.get("total")
    if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in (done, total)):
        return None
    percent = 100.0 if total <= 0 else max(0.0, min(100.0, 100.0 * done / total))
    return {"done": done, "total": total, "percent": round(percent, 1)}


def read_children(model_admin: ModelAdmin, children: Any) -> list[dict[str, Any]]:
    """Read the children a workflow recorded: ids, or objects with an `id` (and maybe more)."""
    if not isinstance(children, list):
        return []
    read = []
    for child in children:
        if isinstance(child, dict) and child.get("id") is not None:
            child_id, queue = str(child["id"]), child.get("queue")
            details = {key: value for key, value in child.items() if key not in ("id", "queue")}
        elif isinstance(child, str | int):
            child_id, queue, details = str(child), None, {}
        else:
            continue
        read.append(
            {
                "id": child_id,
                "url": task_url(model_admin, child_id, queue if isinstance(queue, str) else None),
                "details": details,
            }
        )
    return read


def not_found(request: HttpRequest, model_admin: ModelAdmin, ops: Operations, task_id: str) -> HttpResponse:
    """Say the task is not in Redis, linking to its finished record if the mirror has one."""
    finished_url = None
    if ops.allows(VIEW_HISTORY):
        finished = ops.finished_tasks().filter(task_id=task_id).only("task_id").first()
        if finished is not None:
            try:
                finished_url = reverse(
                    f"{model_admin.admin_site.name}:django_rtq_finishedtask_change", args=[quote(finished.pk)]
                )
            except NoReverseMatch:
                finished_url = None
    context = page_context(
        request,
        model_admin,
        title="Task not found",
        task_id=task_id,
        finished_url=finished_url,
        detail=f"No task with id {task_id!r} is in Redis: it never existed, or it finished and "
        f"its retention ended, or it was deleted.",
    )
    return TemplateResponse(request, "admin/django_rtq/task_not_found.html", context, status=404)


def task_history(ops: Operations, task_id: str) -> list[TaskEdit]:
    """The edits of a task's arguments, the latest first; none if its table cannot be read (a
    project that has not run `migrate`: the task page still shows the rest)."""
    try:
        return list(ops.task_edits(task_id)[:50])
    except DatabaseError:
        return []

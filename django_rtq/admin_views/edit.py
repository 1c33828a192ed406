"""Editing a failed or archived task's arguments as JSON, then running it again.

The form checks the JSON and the handler's signature (the operations layer's rule, as an
enqueue's) and shows what is wrong; valid arguments lead to the confirmation page every action
has, old and new side by side; confirming edits the task, moves it to pending and records who
edited what in its history (`TaskEdit`).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from ..exceptions import InvalidArguments, InvalidStateTransition, TaskNotFound
from ..operations import Operations
from ..registry import get_task_type
from .actions import confirmation
from .common import admin_url, live_view, page_context, task_url
from .tasks import not_found


@live_view()
def task_edit(request: HttpRequest, model_admin: ModelAdmin, ops: Operations, task_id: str) -> HttpResponse:
    queue = request.POST.get("queue") or request.GET.get("queue") or None
    try:
        task = ops.editable_task(task_id, queue)
    except TaskNotFound:
        return not_found(request, model_admin, ops, task_id)
    except InvalidStateTransition as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(task_url(model_admin, task_id, queue))
    message = task.message
    assert message is not None  # editable_task checked
    page = task_url(model_admin, task.id, task.queue)
    args_text, kwargs_text = as_text(message.args), as_text(message.kwargs)
    errors: dict[str, str] = {}
    if request.method == "POST":
        args_text, kwargs_text = request.POST.get("args", ""), request.POST.get("kwargs", "")
        args, errors["args"] = parse(args_text, list, "a JSON list")
        kwargs, errors["kwargs"] = parse(kwargs_text, dict, "a JSON object")
        if not errors["args"] and not errors["kwargs"]:
            try:
                ops.check_edit(task, args, kwargs)
            except InvalidArguments as exc:
                errors["call"] = str(exc)
        errors = {field: error for field, error in errors.items() if error}
        if not errors and request.POST.get("confirm") == "yes":
            try:
                ops.edit_and_run(task.id, args, kwargs, task.queue)
            except (InvalidStateTransition, InvalidArguments, TaskNotFound) as exc:
                messages.error(request, str(exc))
            else:
                messages.success(
                    request, f"Task {task.id!r} of queue {task.queue!r} edited and moved to pending."
                )
            return HttpResponseRedirect(page)
        if not errors:
            return confirmation(
                request,
                model_admin,
                question=f"Edit the arguments of task {task.id!r} ({message.task}, {task.state}) "
                f"of queue {task.queue!r} and run it again?",
                changes=[
                    ("Arguments", as_text(message.args), as_text(args)),
                    ("Keyword arguments", as_text(message.kwargs), as_text(kwargs)),
                ],
                hidden=[
                    ("queue", task.queue),
                    ("args", json.dumps(args, ensure_ascii=False)),
                    ("kwargs", json.dumps(kwargs, ensure_ascii=False)),
                ],
                confirm_label="Yes, edit and run again",
                back=page,
            )
    task_type = get_task_type(message.task)
    context = page_context(
        request,
        model_admin,
        title=f"Edit the arguments of task {task.id}",
        subtitle=message.task,
        task=task,
        message=message,
        signature=signature_text(task_type.func) if task_type else None,
        args_text=args_text,
        kwargs_text=kwargs_text,
        errors=errors,
        task_page=page,
        list_url=admin_url(model_admin, "tasks", task.state, query={"queue": task.queue}),
        post_url=request.path,
    )
    status = 400 if errors else 200
    return TemplateResponse(request, "admin/django_rtq/task_edit.html", context, status=status)


def parse(text: str, kind: type, expected: str) -> tuple[Any, str]:
    """The JSON in `text` if it is of `kind` (an empty field: an empty one), and an error or ""."""
    if not text.strip():
        return kind(), ""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return kind(), f"Not valid JSON: {exc}."
    if not isinstance(value, kind):
        return kind(), f"Expected {expected}, not {type(value).__name__}."
    return value, ""


def as_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def signature_text(func: Any) -> str | None:
    try:
        return f"{getattr(func, '__name__', 'handler')}{inspect.signature(func)}"
    except (TypeError, ValueError):
        return None

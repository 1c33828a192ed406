"""Translate a task, live (a TaskInfo) or finished (a mirror row), into `TaskSerializer` data."""

from __future__ import annotations

from typing import Any

from ..broker.inspect import TaskInfo
from ..broker.states import TaskState
from ..formats import utc_datetime
from ..models import FinishedTask


def task_data(task: TaskInfo | FinishedTask, held_back: str | None = None) -> dict[str, Any]:
    """What `Operations.find_task` found, as `TaskSerializer` data."""
    return live_task_data(task, held_back) if isinstance(task, TaskInfo) else finished_task_data(task)


def live_task_data(task: TaskInfo, held_back: str | None = None) -> dict[str, Any]:
    """A task in Redis as `TaskSerializer` data; `held_back` is why it is held back, if it is
    (`Operations.held_reason`)."""
    message, info = task.message, task.info
    return {
        "id": task.id,
        "queue": task.queue,
        "state": task.state,
        "live": True,
        "task": message.task if message else None,
        "args": message.args if message else [],
        "kwargs": message.kwargs if message else {},
        "priority": message.priority if message else 0,
        "max_retries": message.max_retries if message else None,
        "retried": task.retried,
        "error": task.last_error,
        "error_type": info.get("error_type"),
        "traceback": info.get("traceback") or None,
        "errors": _list(info.get("errors")),
        "result": task.result,
        "progress": task.progress or info.get("progress"),
        "enqueued_at": utc_datetime(message.enqueued_at if message else None),
        "process_at": utc_datetime(message.process_at if message else None),
        "state_at": utc_datetime(task.score_at),
        "started_at": utc_datetime(info.get("started_at")),
        "finished_at": utc_datetime(info.get("finished_at") or info.get("failed_at")),
        "worker": task.owner or info.get("worker"),
        "held_back": held_back,
    }


def finished_task_data(row: FinishedTask) -> dict[str, Any]:
    """A finished task (a mirror row, saved or not) as `TaskSerializer` data."""
    return {
        "id": row.task_id,
        "queue": row.queue,
        "state": TaskState.COMPLETED if row.succeeded else TaskState.ARCHIVED,
        "live": False,
        "task": row.task_name or None,
        "args": row.args,
        "kwargs": row.kwargs,
        "priority": row.priority,
        "max_retries": None,
        "retried": max(0, row.attempts - 1),
        "error": row.error_message or None,
        "error_type": row.error_class or None,
        "traceback": row.traceback or None,
        "errors": _list(row.errors),
        "result": row.return_value,
        "progress": None,
        "enqueued_at": row.enqueued_at,
        "process_at": None,
        "state_at": row.finished_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "worker": row.worker or None,
        "held_back": None,
    }


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

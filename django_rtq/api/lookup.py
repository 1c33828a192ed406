"""Find a task by id: live in Redis, else among finished tasks (the mirror's buffer, then the ORM)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..broker.inspect import TaskInfo
from ..broker.states import TaskState
from ..conf import get_settings
from ..connection import get_broker, get_inspector
from ..exceptions import TaskNotFound
from ..mirror import row_from_record
from ..models import FinishedTask


def find_task(task_id: str, queue: str | None = None) -> dict[str, Any]:
    """Return the task's data for `TaskSerializer`; raise TaskNotFound if no trace of it is left."""
    inspector = get_inspector()
    try:
        return live_task_data(inspector.get_task(task_id, queue))
    except TaskNotFound:
        pass
    queues = [queue] if queue else inspector.queues()
    for name, record in get_broker().finished_records(task_id, queues).items():
        return finished_task_data(row_from_record(task_id, name, record))
    rows = FinishedTask.objects.using(get_settings().MIRROR_DATABASE).filter(pk=task_id)
    if queue:
        rows = rows.filter(queue=queue)
    row = rows.first()
    if row is None:
        raise TaskNotFound(f"No task with id {task_id!r}" + (f" in queue {queue!r}." if queue else "."))
    return finished_task_data(row)


def live_task_data(task: TaskInfo) -> dict[str, Any]:
    """A task in Redis as `TaskSerializer` data."""
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
        "progress": getattr(task, "progress", None) or info.get("progress"),
        "enqueued_at": as_datetime(message.enqueued_at if message else None),
        "process_at": as_datetime(message.process_at if message else None),
        "state_at": as_datetime(task.score_at),
        "started_at": as_datetime(info.get("started_at")),
        "finished_at": as_datetime(info.get("finished_at") or info.get("failed_at")),
        "worker": task.owner or info.get("worker"),
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
    }


def as_datetime(epoch_seconds: Any) -> datetime | None:
    if not isinstance(epoch_seconds, int | float) or isinstance(epoch_seconds, bool):
        return None
    try:
        return datetime.fromtimestamp(epoch_seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

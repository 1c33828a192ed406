"""One view of a task, live (in Redis) or finished (a mirror row), that every surface formats.

The API, the commands, the admin and the `django.tasks` backend each turn a `TaskView` into
their own output; what a task's facts mean (its worker, its errors, when it finished) is read
here once, from the inspector's `TaskInfo` or from a `FinishedTask` row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .broker.attempt import AttemptInfo, error_records
from .broker.inspect import TaskInfo
from .broker.message import TaskMessage
from .broker.states import TaskState
from .conf import get_settings
from .formats import utc_datetime
from .models import FinishedTask


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskView:
    """A task as the surfaces show it. Times are datetimes: aware in UTC for a live task, as the
    row keeps them for a finished one. A finished task has no message, attempt facts nor score."""

    id: str
    queue: str
    state: TaskState
    live: bool
    task: str | None  # the task type's name; None when the message cannot be read
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    max_retries: int | None
    retried: int
    error: str | None  # the latest error's message
    error_type: str | None
    traceback: str | None
    errors: list[Any]  # {"type", "message", "traceback"} per failed attempt, the latest ones
    result: Any
    progress: dict[str, Any] | None
    enqueued_at: datetime | None
    process_at: datetime | None
    state_at: datetime | None  # when it is next due, archived, its lease or retention ends
    started_at: datetime | None  # its first attempt
    finished_at: datetime | None
    last_attempted_at: datetime | None  # as recorded: a running attempt is recorded as it ends
    worker: str | None  # running it, or of its latest attempt
    workers: list[str]  # one per attempt, a running one included
    held_back: str | None = None  # why its type's limits hold it back (Operations.held_reason)
    snoozed: int = 0  # times its handler snoozed it (raised Snooze), no attempt counted
    checkpoint: Any = None  # the latest checkpoint a run saved (docs/checkpoints.md), decoded
    checkpointed_at: datetime | None = None  # when it was saved
    # Live only
    message: TaskMessage | None = None  # None when the stored message is corrupt
    raw_message: str | None = None
    attempt: AttemptInfo = field(default_factory=AttemptInfo)
    owner: str | None = None  # the worker holding an active task
    began_at: float | None = None  # when an active task's run began, once a heartbeat noted it
    score_at: float | None = None  # state_at in epoch seconds
    held: bool = False
    waits_for_worker: bool = False  # left by a worker that could not run it, for one that can
    workflow: dict[str, Any] | None = None
    children: list[Any] = field(default_factory=list)  # a workflow's running (or recorded) children

    @property
    def error_records(self) -> list[dict[str, Any]]:
        """The recorded errors, leaving out any malformed."""
        return error_records(self.errors)

    @property
    def running_since(self) -> datetime | None:
        """For an active task, when its run began: as the worker's first heartbeat of the run
        noted it, until then its lease's start (the same time: see extend_leases.lua). It does
        not move as the lease is renewed."""
        if self.state != TaskState.ACTIVE:
            return None
        if self.began_at is not None:
            return utc_datetime(self.began_at)
        if self.score_at is None:
            return None
        return utc_datetime(self.score_at - get_settings().LEASE_SECONDS)


def task_view(task: TaskInfo | FinishedTask, held_back: str | None = None) -> TaskView:
    """What `Operations.find_task` found, as a view."""
    return view_of_live_task(task, held_back) if isinstance(task, TaskInfo) else view_of_finished_task(task)


def view_of_live_task(task: TaskInfo, held_back: str | None = None) -> TaskView:
    """A task in Redis; `held_back` is why it is held back, if it is (`Operations.held_reason`)."""
    message, attempt = task.message, task.attempt
    workers = list(attempt.workers)
    if task.state == TaskState.ACTIVE:
        workers.append(task.owner or "")
    return TaskView(
        id=task.id,
        queue=task.queue,
        state=task.state,
        live=True,
        task=message.task if message else None,
        args=message.args if message else [],
        kwargs=message.kwargs if message else {},
        priority=message.priority if message else 0,
        max_retries=message.max_retries if message else None,
        retried=attempt.retried,
        error=attempt.error,
        error_type=attempt.error_type,
        traceback=attempt.traceback or None,
        errors=attempt.errors,
        result=task.result,
        progress=task.progress or attempt.get("progress"),
        enqueued_at=utc_datetime(message.enqueued_at if message else None),
        process_at=utc_datetime(message.process_at if message else None),
        state_at=utc_datetime(task.score_at),
        started_at=utc_datetime(attempt.started_at),
        finished_at=utc_datetime(attempt.ended_at),
        last_attempted_at=utc_datetime(attempt.attempted_at),
        worker=task.owner or attempt.worker,
        workers=workers,
        held_back=held_back,
        snoozed=attempt.snoozed,
        checkpoint=_decoded(attempt.checkpoint_json),
        checkpointed_at=utc_datetime(attempt.checkpointed_at),
        message=message,
        raw_message=task.raw_message,
        attempt=attempt,
        owner=task.owner,
        began_at=task.began_at,
        score_at=task.score_at,
        held=task.held,
        waits_for_worker=task.waits_for_worker,
        workflow=task.workflow,
        children=task.children or _list(attempt.get("children")),
    )


def view_of_finished_task(row: FinishedTask) -> TaskView:
    """A finished task: a mirror row, saved or not (still in the mirror's buffer)."""
    return TaskView(
        id=row.task_id,
        queue=row.queue,
        state=TaskState.COMPLETED if row.succeeded else TaskState.ARCHIVED,
        live=False,
        task=row.task_name or None,
        args=row.args,
        kwargs=row.kwargs,
        priority=row.priority,
        max_retries=None,
        retried=max(0, row.attempts - 1),
        error=row.error_message or None,
        error_type=row.error_class or None,
        traceback=row.traceback or None,
        errors=_list(row.errors),
        result=row.return_value,
        progress=None,
        enqueued_at=row.enqueued_at,
        process_at=None,
        state_at=row.finished_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=_last_attempt(row),
        worker=row.worker or None,
        workers=row.workers or [row.worker] * row.attempts,
    )


def _last_attempt(row: FinishedTask) -> datetime | None:
    """When the row's last attempt started: never before the first (both are rounded to µs)."""
    if row.duration is None:
        return row.started_at
    last = row.finished_at - row.duration
    return max(last, row.started_at) if row.started_at else last


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _decoded(raw: str | None) -> Any:
    """A stored checkpoint's value; its text as it is if that is not JSON (a corrupt one)."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw

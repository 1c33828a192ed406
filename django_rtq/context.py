"""What a running handler can learn about its own task."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskContext:
    """The task a handler is running for."""

    id: str
    task: str  # task type name
    queue: str
    retried: int  # retries before this attempt
    max_retries: int
    worker_id: str = ""
    enqueued_at: float = 0.0  # epoch seconds
    priority: int = 0  # as enqueued
    process_at: float | None = None  # when it was enqueued to run, if later than at once
    started_at: float = 0.0  # of this attempt, epoch seconds
    deadline: float | None = None  # epoch seconds by which it must have finished, if any
    info: dict = field(default_factory=dict)  # attempt facts before this attempt (workers, errors)

    def progress(self, done: float, total: float | None = None) -> None:
        """Report how far the task has come (`done` of `total`), for the inspector and admin."""
        from .broker.workflow import set_progress
        from .connection import get_broker

        set_progress(get_broker(), self.queue, self.id, done, total)


_current: ContextVar[TaskContext | None] = ContextVar("rtq_current_task", default=None)


def current_task() -> TaskContext | None:
    """Return the task being run, inside a handler run by a worker; None elsewhere."""
    return _current.get()


def set_current_task(context: TaskContext | None) -> None:
    _current.set(context)

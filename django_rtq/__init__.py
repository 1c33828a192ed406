"""django-rtq: a Django task queue whose live state is in Redis.

The public names below are imported on first use, so that `django_rtq.broker` (which knows
nothing of Django) can be imported, and tested, without Django.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .connection import get_broker
    from .context import TaskContext, current_task
    from .exceptions import (
        BrokerUnavailable,
        BulkJobNotFound,
        CheckpointNotSaved,
        DeadlineExceeded,
        DuplicateTask,
        InvalidArguments,
        InvalidStateTransition,
        InvalidTask,
        LeaseLost,
        NonRetryableError,
        QueueInUse,
        QueueNotFound,
        RTQError,
        Snooze,
        StoppedAtCheckpoint,
        TaskCancelled,
        TaskIdConflict,
        TaskNotFound,
        TaskTimeout,
        WorkerShutdown,
        WorkflowTooDeep,
    )
    from .operations import Operations
    from .registry import TaskType, enqueue_many, task

#: Each public name and the module it comes from. The errors are the ones your code catches, and
#: NonRetryableError, which a handler raises (WorkerLost and CorruptWorkflow are only recorded).
_EXPORTS = {
    "BrokerUnavailable": ".exceptions",
    "BulkJobNotFound": ".exceptions",
    "CheckpointNotSaved": ".exceptions",
    "DeadlineExceeded": ".exceptions",
    "DuplicateTask": ".exceptions",
    "InvalidArguments": ".exceptions",
    "InvalidStateTransition": ".exceptions",
    "InvalidTask": ".exceptions",
    "LeaseLost": ".exceptions",
    "NonRetryableError": ".exceptions",
    "Operations": ".operations",
    "QueueInUse": ".exceptions",
    "QueueNotFound": ".exceptions",
    "RTQError": ".exceptions",
    "Snooze": ".exceptions",
    "StoppedAtCheckpoint": ".exceptions",
    "TaskCancelled": ".exceptions",
    "TaskContext": ".context",
    "TaskIdConflict": ".exceptions",
    "TaskNotFound": ".exceptions",
    "TaskTimeout": ".exceptions",
    "TaskType": ".registry",
    "WorkerShutdown": ".exceptions",
    "WorkflowTooDeep": ".exceptions",
    "current_task": ".context",
    "enqueue_many": ".registry",
    "get_broker": ".connection",
    "task": ".registry",
}
__all__ = [
    "BrokerUnavailable",
    "BulkJobNotFound",
    "CheckpointNotSaved",
    "DeadlineExceeded",
    "DuplicateTask",
    "InvalidArguments",
    "InvalidStateTransition",
    "InvalidTask",
    "LeaseLost",
    "NonRetryableError",
    "Operations",
    "QueueInUse",
    "QueueNotFound",
    "RTQError",
    "Snooze",
    "StoppedAtCheckpoint",
    "TaskCancelled",
    "TaskContext",
    "TaskIdConflict",
    "TaskNotFound",
    "TaskTimeout",
    "TaskType",
    "WorkerShutdown",
    "WorkflowTooDeep",
    "current_task",
    "enqueue_many",
    "get_broker",
    "task",
]
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'django_rtq' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # once imported, a plain module attribute
    return value


def __dir__() -> list[str]:
    return [*globals(), *_EXPORTS]

"""django-rtq: a Django task queue whose live state is in Redis."""

from .connection import get_broker, get_inspector
from .context import TaskContext, current_task
from .exceptions import NonRetryableError
from .registry import TaskType, enqueue_many, task

__all__ = [
    "NonRetryableError",
    "TaskContext",
    "TaskType",
    "current_task",
    "enqueue_many",
    "get_broker",
    "get_inspector",
    "task",
]
__version__ = "0.1.0"

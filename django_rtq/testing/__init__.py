"""Helpers for testing code that uses django-rtq: capture, eager runs, burst workers, fake Redis.

See docs/testing.md. pytest fixtures: `pytest_plugins = ["django_rtq.testing.pytest_plugin"]`.
The names below are imported on first use, so that the plugin loads before Django is set up.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .capture import UNCHECKED, CapturedTasks, capture_tasks
    from .eager import EagerRuns, run_eagerly
    from .fake import use_fake_redis
    from .running import TaskRun, TooManyNestedTasks, run_message
    from .worker import BurstSummary, BurstTimeout, run_worker_burst

_EXPORTS = {
    "UNCHECKED": ".capture",
    "BurstSummary": ".worker",
    "BurstTimeout": ".worker",
    "CapturedTasks": ".capture",
    "EagerRuns": ".eager",
    "TaskRun": ".running",
    "TooManyNestedTasks": ".running",
    "capture_tasks": ".capture",
    "run_eagerly": ".eager",
    "run_message": ".running",
    "run_worker_burst": ".worker",
    "use_fake_redis": ".fake",
}
__all__ = [
    "UNCHECKED",
    "BurstSummary",
    "BurstTimeout",
    "CapturedTasks",
    "EagerRuns",
    "TaskRun",
    "TooManyNestedTasks",
    "capture_tasks",
    "run_eagerly",
    "run_message",
    "run_worker_burst",
    "use_fake_redis",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'django_rtq.testing' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *_EXPORTS]

"""The options of task types, calls and workflow steps: which exist, and their checks."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any

from croniter import croniter
from django.core.exceptions import ImproperlyConfigured

from .broker.limits import QUEUE_SCOPE, Limit, make_limit
from .broker.message import MAX_ID_LENGTH
from .conf import LIMIT_OPTIONS, validate_queue_name
from .exceptions import InvalidTask

#: Options a task type takes in `@task(...)`; all but `retry_backoff` can be overridden per call.
TYPE_OPTIONS = frozenset(
    {
        "queue",
        "priority",
        "max_retries",
        "retry_backoff",
        "timeout",
        "deadline",
        "unique",
        "unique_key",
        "debounce",
        "debounce_key",
        "retention",
        "cron",
        "every",
        "expose",
        *LIMIT_OPTIONS,
    }
)
#: Type options that make a task periodic (see periodic.py); not for one call.
SCHEDULE_OPTIONS = frozenset({"cron", "every"})
#: Options that only make sense for one call, through `.using(...)`.
CALL_OPTIONS = frozenset({"delay", "process_at", "task_id"})
#: What `TaskType.using(...)` takes: the type's options a call may override, and the call's own.
USING_OPTIONS = TYPE_OPTIONS - {"retry_backoff", "expose", *SCHEDULE_OPTIONS, *LIMIT_OPTIONS} | CALL_OPTIONS
#: Options that merge calls (docs/debounce.md): a workflow's steps each run, so never debounced.
DEBOUNCE_OPTIONS = frozenset({"debounce", "debounce_key"})
#: Per-call options a workflow step may carry (the same as `TaskType.using` takes, but the task
#: id: the workflow gives its children ids of its own; and debouncing).
STEP_OPTIONS = TYPE_OPTIONS - {
    "retry_backoff",
    "expose",
    *SCHEDULE_OPTIONS,
    *DEBOUNCE_OPTIONS,
} | CALL_OPTIONS - {"task_id"}
#: A task id of your own: 1 to 255 printable ASCII characters but / \ % ? # (and no spaces), so
#: that it is one URL path segment, reads the same quoted or not, and fits the ORM mirror's
#: column. A workflow's children get its id with ".<position>" added, or, past that length, a
#: shorter id of the same characters (broker/workflow.py, child_id).
TASK_ID_PATTERN = re.compile(rf"(?:(?![/\\%?#])[!-~]){{1,{MAX_ID_LENGTH}}}")
TASK_ID_RULE = f"1 to {MAX_ID_LENGTH} printable ASCII characters other than / \\ % ? # (no spaces)"


def check_options(options: dict[str, Any], allowed: frozenset[str], task_name: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidTask(
            f"Unknown option(s) {', '.join(map(repr, unknown))} for task {task_name!r}; "
            f"expected some of: {', '.join(sorted(allowed))}."
        )


def check_queue(queue: Any, task_name: str) -> None:
    """Raise InvalidTask unless `queue` is a valid queue name."""
    try:
        validate_queue_name(queue if isinstance(queue, str) else "")
    except ImproperlyConfigured as exc:
        raise InvalidTask(f"Task {task_name!r}: {exc}") from None


def task_limit(options: dict[str, Any], task_name: str) -> Limit | None:
    """The flow-control limits that a task type's options set; ImproperlyConfigured if invalid."""
    if all(options.get(name) is None for name in LIMIT_OPTIONS):
        return None
    if task_name == QUEUE_SCOPE or "\0" in task_name or "\1" in task_name:
        raise ImproperlyConfigured(
            f"Task {task_name!r} cannot have flow-control limits: its name is {QUEUE_SCOPE!r} (a "
            "queue's own limits) or holds a \\0 or \\1 character. Give it another name."
        )
    try:
        return make_limit(**{name: options.get(name) for name in LIMIT_OPTIONS}, where=f"Task {task_name!r}")
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def check_schedule(name: str, *, cron: Any, every: Any) -> tuple[str | None, float | None]:
    """Validate a schedule's timing (exactly one of a cron expression or an interval);
    return (cron, every in seconds). `@task` checks its own; periodic.py those of settings."""
    if (cron is None) == (every is None):
        which = "both" if cron is not None else "neither"
        raise ImproperlyConfigured(f"Periodic task {name!r} needs either 'cron' or 'every', not {which}.")
    if cron is not None:
        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise ImproperlyConfigured(
                f"Periodic task {name!r}: {cron!r} is not a valid cron expression "
                f"(five fields, minute hour day-of-month month day-of-week, e.g. '*/5 * * * *')."
            )
        return cron, None
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or seconds < 0.001
    ):
        raise ImproperlyConfigured(
            f"Periodic task {name!r}: 'every' must be a positive number of seconds or a timedelta "
            f"(a millisecond at least), not {every!r}."
        )
    return None, float(seconds)


def as_seconds(value: Any, what: str, *, allow_none: bool = False) -> float | None:
    """Read a duration given as seconds or a timedelta; InvalidTask if it is neither."""
    if value is None and allow_none:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise InvalidTask(f"{what} must be a non-negative number of seconds or a timedelta, not {value!r}.")
    return float(value)


#: Epoch seconds below this (September 2001) are taken for a mistake: a duration given where a
#: point in time is wanted (Celery's `expires=60`, say), which would be decades past already.
EARLIEST_EPOCH = 1_000_000_000


def as_instant(value: Any, what: str, now: float) -> float | None:
    """Read a point in time given as an aware or naive datetime, a timedelta from now, or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, timedelta):
        return now + value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < EARLIEST_EPOCH:
            raise InvalidTask(
                f"{what}={value!r} is read as epoch seconds, a moment in {1970 + int(value // 31_557_600)}; "
                f"for {value!r} seconds from now, give {what}=timedelta(seconds={value!r})."
            )
        return float(value)
    raise InvalidTask(f"{what} must be a datetime, a timedelta or epoch seconds, not {value!r}.")

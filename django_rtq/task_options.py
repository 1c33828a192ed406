"""The options of task types, calls and workflow steps: which exist, and their checks."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from croniter import croniter
from django.core.exceptions import ImproperlyConfigured

from .broker.limits import PARTITION_SEPARATOR, QUEUE_SCOPE, Limit, PartitionLimits, make_limit
from .broker.message import MAX_ID_LENGTH, MAX_PARTITION_LENGTH, MAX_PARTITION_WEIGHT, is_partition_name
from .conf import LIMIT_OPTIONS, validate_queue_name
from .exceptions import InvalidTask

#: Options of a task type's partitions (docs/partitions.md) that only the type sets: how a call's
#: partition is found, and the limits of each partition. A call may give its own `partition`.
PARTITION_TYPE_OPTIONS = frozenset(
    {
        "partition_by",
        "partition_max_concurrency",
        "partition_rate_limit",
        "partition_burst",
        "partition_limits",
    }
)
#: What `partition_limits={"acme": {...}}` may set for a partition it names.
NAMED_PARTITION_OPTIONS = frozenset({*LIMIT_OPTIONS, "weight"})
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
        "partition",
        *LIMIT_OPTIONS,
        *PARTITION_TYPE_OPTIONS,
    }
)
#: Type options that make a task periodic (see periodic.py); not for one call.
SCHEDULE_OPTIONS = frozenset({"cron", "every"})
#: Options that only make sense for one call, through `.using(...)`.
CALL_OPTIONS = frozenset({"delay", "process_at", "task_id"})
#: What `TaskType.using(...)` takes: the type's options a call may override, and the call's own.
USING_OPTIONS = (
    TYPE_OPTIONS - {"retry_backoff", "expose", *SCHEDULE_OPTIONS, *LIMIT_OPTIONS, *PARTITION_TYPE_OPTIONS}
    | CALL_OPTIONS
)
#: Options that merge calls (docs/debounce.md): a workflow's steps each run, so never debounced.
DEBOUNCE_OPTIONS = frozenset({"debounce", "debounce_key"})
#: Per-call options a workflow step may carry (the same as `TaskType.using` takes, but the task
#: id: the workflow gives its children ids of its own; and debouncing).
STEP_OPTIONS = TYPE_OPTIONS - {
    "retry_backoff",
    "expose",
    *SCHEDULE_OPTIONS,
    *DEBOUNCE_OPTIONS,
    *PARTITION_TYPE_OPTIONS,
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
    _check_limited_name(task_name)
    try:
        return make_limit(**{name: options.get(name) for name in LIMIT_OPTIONS}, where=f"Task {task_name!r}")
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def _check_limited_name(task_name: str) -> None:
    if task_name == QUEUE_SCOPE or any(c in task_name for c in ("\0", "\1", PARTITION_SEPARATOR)):
        raise ImproperlyConfigured(
            f"Task {task_name!r} cannot have flow-control limits: its name is {QUEUE_SCOPE!r} (a "
            "queue's own limits) or holds a \\0, \\1 or \\2 character. Give it another name."
        )


def partition_limits(options: dict[str, Any], task_name: str) -> PartitionLimits | None:
    """The limits a task type's options set for its partitions (None when they set none, weights
    aside); ImproperlyConfigured if invalid."""
    where = f"Task {task_name!r}"
    each_options = {name: options.get(f"partition_{name}") for name in LIMIT_OPTIONS}
    named_options = options.get("partition_limits") or {}
    if all(value is None for value in each_options.values()) and not named_options:
        return None
    _check_limited_name(task_name)
    try:
        each = make_limit(**each_options, where=f"{where} (partition_...)")
        if not isinstance(named_options, dict):
            raise ValueError(
                f"{where}: partition_limits must be a dict of partition -> limits, not {named_options!r}."
            )
        named = {}
        for partition, spec in named_options.items():
            check_partition_name(partition, f"{where}: partition_limits key")
            if not isinstance(spec, dict) or not spec or set(spec) - NAMED_PARTITION_OPTIONS:
                raise ValueError(
                    f"{where}: partition_limits[{partition!r}] must be a dict of some of "
                    f"{', '.join(sorted(NAMED_PARTITION_OPTIONS))}, not {spec!r}."
                )
            partition_weight({"partition_limits": named_options}, partition)  # checks it
            limit = make_limit(
                **{name: spec.get(name) for name in LIMIT_OPTIONS}, where=f"{where}: partition {partition!r}"
            )
            if limit is not None:
                named[partition] = limit
    except (ValueError, InvalidTask) as exc:
        raise ImproperlyConfigured(str(exc)) from None
    if each is None and not named:
        return None  # weights alone: they order the tasks at enqueue, and limit no claim
    return PartitionLimits(each=each, named=named)


def partition_weight(options: dict[str, Any], partition: str) -> int:
    """The weight (turns per round) `partition_limits` gives a partition: 1 unless it names it."""
    weight = ((options.get("partition_limits") or {}).get(partition) or {}).get("weight", 1)
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= MAX_PARTITION_WEIGHT:
        raise InvalidTask(
            f"A partition's weight must be a whole number from 1 to {MAX_PARTITION_WEIGHT}, not {weight!r}."
        )
    return weight


def check_partition_by(partition_by: Any, func: Callable[..., Any], task_name: str) -> None:
    """`partition_by` must name a parameter of the handler, or be a callable of its arguments."""
    if partition_by is None or callable(partition_by):
        return
    if not isinstance(partition_by, str):
        raise ImproperlyConfigured(
            f"Task {task_name!r}: partition_by must be the name of an argument or a callable taking "
            f"the task's arguments, not {partition_by!r}."
        )
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if partition_by not in parameters and not takes_any:
        raise ImproperlyConfigured(
            f"Task {task_name!r}: partition_by={partition_by!r} names no argument of the handler "
            f"(it takes {', '.join(parameters) or 'none'})."
        )


PARTITION_RULE = f"1 to {MAX_PARTITION_LENGTH} characters, none of them a control character"


def check_partition_name(value: Any, what: str) -> str:
    """A partition's name: a string (or an int, written as one) of PARTITION_RULE; else InvalidTask."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not is_partition_name(value):
        raise InvalidTask(f"{what} must be a partition name, {PARTITION_RULE} (or an int), not {value!r}.")
    return value


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

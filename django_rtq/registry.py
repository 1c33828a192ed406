"""Task types: the `@task` decorator, the registry of task types, and enqueueing."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from croniter import croniter
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import sending, signals
from .broker.limits import QUEUE_SCOPE, Limit, make_limit
from .broker.message import MAX_PRIORITY, MIN_PRIORITY, TaskMessage
from .conf import LIMIT_OPTIONS, get_settings, validate_queue_name
from .exceptions import InvalidArguments, InvalidTask
from .queue_names import note_task_queue, warn_if_unnamed
from .retry import Backoff, resolve_backoff

if TYPE_CHECKING:
    from .workflows.canvas import Signature

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
#: A task id of your own: 1 to 255 printable ASCII characters but / \ % ? # (and no spaces), so
#: that it is one URL path segment, reads the same quoted or not, and fits the ORM mirror's
#: column. A workflow's children get its id with ".<position>" added: keep workflows' ids shorter.
TASK_ID_PATTERN = re.compile(r"(?:(?![/\\%?#])[!-~]){1,255}")
TASK_ID_RULE = "1 to 255 printable ASCII characters other than / \\ % ? # (no spaces)"

_registry: dict[str, TaskType] = {}
#: Bumped at each registration, so that what is derived from the registry knows to start over.
_generation = 0
#: What makes a workflow step of a task call, for `TaskType.s()` and `.si()`: the workflows sit
#: above the registry, so they hand it over when imported (see `set_step_factory`).
_step_factory: Callable[..., Signature] | None = None


@dataclass(frozen=True, slots=True, eq=False)  # hashable by identity: it is a signal sender
class TaskType:
    """A registered task function, with its options. Call it to run the function directly."""

    func: Callable[..., Any]
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    is_async: bool = field(init=False)  # an `async def` function
    # its flow-control limits (`rate_limit`, `burst`, `max_concurrency`), if it has any
    limit: Limit | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.func))
        object.__setattr__(self, "limit", task_limit(self.options, self.name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @property
    def exposed(self) -> bool:
        """Whether the REST API may enqueue this task type (`@task(expose=True)`)."""
        return bool(self.options.get("expose"))

    @property
    def retry_backoff(self) -> Backoff:
        return resolve_backoff(self.options.get("retry_backoff") or get_settings().RETRY_BACKOFF)

    def using(self, **options: Any) -> TaskType:
        """Return this task type with options overridden for the calls made through it."""
        check_options(
            options,
            TYPE_OPTIONS - {"retry_backoff", "expose", *SCHEDULE_OPTIONS, *LIMIT_OPTIONS} | CALL_OPTIONS,
            self.name,
        )
        return replace(self, options={**self.options, **options})

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A call of this task as a workflow step; it receives the previous step's result first."""
        return _make_step(self, args, kwargs, immutable=False)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """A call of this task as a workflow step that ignores the previous step's result."""
        return _make_step(self, args, kwargs, immutable=True)

    def prepare(self, *args: Any, **kwargs: Any) -> TaskMessage:
        """Build (and validate) the message an enqueue of these arguments would send."""
        return build_message(self, args, kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> TaskMessage:
        """Enqueue a call of this task; return its message (`.id` identifies it)."""
        message = self.prepare(*args, **kwargs)
        sending.enqueue([message], announce=announce_enqueued)
        return message

    def enqueue_on_commit(self, *args: Any, **kwargs: Any) -> TaskMessage:
        """Enqueue once the current database transaction commits (at once outside one). The
        task is stored in the transaction meanwhile, so that it is sent even if Redis is away
        at the commit (the transactional outbox: django_rtq/outbox.py)."""
        message = self.prepare(*args, **kwargs)
        sending.enqueue([message], announce=announce_enqueued, on_commit=True)
        return message


def set_step_factory(factory: Callable[..., Signature]) -> None:
    """Make `TaskType.s()` and `.si()` build their steps with `factory(task_type, args, kwargs,
    immutable=...)`: `django_rtq.workflows` passes its `Signature` when it is imported."""
    global _step_factory
    _step_factory = factory


def _make_step(
    task_type: TaskType, args: tuple[Any, ...], kwargs: dict[str, Any], *, immutable: bool
) -> Signature:
    if _step_factory is None:
        raise ImproperlyConfigured(
            "Workflow steps need django_rtq.workflows, which is not imported yet: add 'django_rtq' "
            "to INSTALLED_APPS (its ready() imports it), or import django_rtq.workflows first."
        )
    return _step_factory(task_type, args, kwargs, immutable=immutable)


def enqueue_many(messages: Iterable[TaskMessage]) -> list[TaskMessage]:
    """Enqueue prepared messages in one round trip (`my_task.prepare(...)` makes them)."""
    messages = list(messages)
    sending.enqueue(messages, announce=announce_enqueued)
    return messages


def announce_enqueued(messages: Sequence[TaskMessage]) -> None:
    """Send `task_enqueued` for each message (nothing to do, and no cost, without receivers)."""
    if signals.task_enqueued.receivers:
        for message in messages:
            signals.task_enqueued.send(_registry.get(message.task), message=message)


def find_task_type(name: str) -> TaskType | None:
    """Return the task type registered under `name`, or else the one a dotted path names: a
    `django.tasks` task run by django-rtq is registered when its module is first imported."""
    task_type = _registry.get(name)
    if task_type is None and "." in name:
        try:
            found = import_string(name)
        except ImportError:
            return None
        if isinstance(found, TaskType):
            return _registry.get(name) or found  # its @task registered it as its module was imported
        task_type = getattr(found, "rtq_task_type", None)
        if not isinstance(task_type, TaskType):
            return None
        register_task(task_type)
    return task_type


def task(func: Callable[..., Any] | None = None, *, name: str | None = None, **options: Any) -> Any:
    """Register a function as a task type: `@task` or `@task(queue="emails", max_retries=3)`."""

    def register(func: Callable[..., Any]) -> TaskType:
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        check_options(options, TYPE_OPTIONS, task_name)
        task_type = TaskType(func=func, name=task_name, options=dict(options))
        if "queue" in options:
            _check_queue(options["queue"], task_name)
        if "retry_backoff" in options:
            resolve_backoff(options["retry_backoff"])
        if not SCHEDULE_OPTIONS.isdisjoint(options):
            check_schedule(task_name, cron=options.get("cron"), every=options.get("every"))
        register_task(task_type)
        return task_type

    return register(func) if func is not None else register


def register_task(task_type: TaskType) -> None:
    existing = _registry.get(task_type.name)
    if existing is not None and _origin(existing.func) != _origin(task_type.func):
        raise ImproperlyConfigured(
            f"Task name {task_type.name!r} is registered twice: by {_origin(existing.func)} and "
            f"{_origin(task_type.func)}. Give one of them another name."
        )
    global _generation
    _registry[task_type.name] = task_type
    _generation += 1
    queue = task_type.options.get("queue")
    if queue:
        note_task_queue(queue)


def registry_generation() -> int:
    """A number that changes whenever a task type is registered."""
    return _generation


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


def get_task_type(name: str) -> TaskType | None:
    return _registry.get(name)


def registered_tasks() -> dict[str, TaskType]:
    return dict(_registry)


def periodic_task_types() -> list[TaskType]:
    """Return the task types declared periodic with `@task(cron=...)` or `@task(every=...)`."""
    return [t for t in _registry.values() if not SCHEDULE_OPTIONS.isdisjoint(t.options)]


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


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def check_options(options: dict[str, Any], allowed: frozenset[str], task_name: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidTask(
            f"Unknown option(s) {', '.join(map(repr, unknown))} for task {task_name!r}; "
            f"expected some of: {', '.join(sorted(allowed))}."
        )


def build_message(
    task_type: TaskType, args: Sequence[Any], kwargs: dict[str, Any], *, tuples_become_lists: bool = False
) -> TaskMessage:
    """Resolve a call's options against the defaults and validate everything into a message.

    The arguments must fit the handler's signature and come back from JSON as they were given,
    tuples aside with `tuples_become_lists` (`django.tasks`' rule); else InvalidArguments."""
    conf = get_settings()
    opts = task_type.options
    now = time.time()
    queue = opts.get("queue") or conf.DEFAULT_QUEUE
    _check_queue(queue, task_type.name)
    warn_if_unnamed(queue, task_type.name)

    priority = opts.get("priority", 0)
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise InvalidTask(
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, not {priority!r}."
        )
    max_retries = opts.get("max_retries", conf.MAX_RETRIES)
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        raise InvalidTask(f"max_retries must be a non-negative integer, not {max_retries!r}.")
    timeout = _seconds(opts.get("timeout", conf.TIMEOUT), "timeout", allow_none=True)
    retention = _seconds(opts.get("retention", conf.RETENTION), "retention")
    deadline = _instant(opts.get("deadline"), "deadline", now)
    process_at = _process_at(opts, now)

    args, kwargs = list(args), dict(kwargs)
    _bind(task_type, args, kwargs)
    arguments_json = _arguments_json(args, kwargs, task_type.name, tuples_become_lists=tuples_become_lists)

    unique = opts.get("unique", False)
    unique_key = opts.get("unique_key")
    unique_ttl = None
    if unique or unique_key:
        unique_ttl = conf.UNIQUE_TTL if unique is True or not unique else _seconds(unique, "unique")
        if unique_key is None:
            digest = hashlib.sha1(arguments_json.encode()).hexdigest()
            unique_key = f"{task_type.name}:{digest}"
        elif not isinstance(unique_key, str) or not unique_key:
            raise InvalidTask(f"unique_key must be a non-empty string, not {unique_key!r}.")

    task_id = opts.get("task_id")
    if task_id is None:
        # 22 URL-safe characters, 128 random bits (a uuid4 has 122): short enough for Redis'
        # 32-byte allocations, and an id is stored three times (msg, state, the state's set).
        # Never a leading "-", which the management commands would take for an option.
        task_id = secrets.token_urlsafe(16)
        while task_id[0] == "-":
            task_id = secrets.token_urlsafe(16)
    elif not isinstance(task_id, str) or not TASK_ID_PATTERN.fullmatch(task_id):
        raise InvalidTask(f"task_id must be {TASK_ID_RULE}, not {task_id!r}.")

    return TaskMessage(
        id=task_id,
        task=task_type.name,
        queue=queue,
        args=args,
        kwargs=kwargs,
        priority=priority,
        max_retries=max_retries,
        timeout=timeout,
        deadline=deadline,
        retention=retention or 0.0,
        unique_key=unique_key,
        unique_ttl=unique_ttl,
        enqueued_at=now,
        process_at=process_at,
    )


def _check_queue(queue: Any, task_name: str) -> None:
    try:
        validate_queue_name(queue if isinstance(queue, str) else "")
    except ImproperlyConfigured as exc:
        raise InvalidTask(f"Task {task_name!r}: {exc}") from None


@lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):  # a callable whose signature Python cannot tell
        return None


def _bind(task_type: TaskType, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Raise InvalidArguments (a TypeError) in the caller if the handler could not take these
    arguments, rather than have the worker fail the task with the same TypeError."""
    signature = _signature(task_type.func)
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArguments(
            f"Task {task_type.name!r} cannot be called with these arguments: {exc} (it takes {signature})."
        ) from None


#: The canonical form of a call's arguments (sorted keys, no spaces) that unique keys hash.
_ARGUMENTS_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def _arguments_json(
    args: list[Any], kwargs: dict[str, Any], task_name: str, *, tuples_become_lists: bool = False
) -> str:
    """Encode the arguments canonically (the unique key hashes this), or say which one is not
    JSON or would not come back from JSON as given. `tuples_become_lists` allows tuples, as
    `django.tasks` does (its own backends hand the handler lists too)."""
    try:
        encoded = _ARGUMENTS_ENCODER.encode([args, kwargs])
    except (TypeError, ValueError):
        pass
    else:
        changed = None
        if any(type(value) not in _SCALARS for value in args) or any(
            type(value) not in _SCALARS for value in kwargs.values()
        ):
            changed = _changed_by_json([args, kwargs], tuples_become_lists)
        if changed is None:
            return encoded
        where, why = changed
        raise InvalidArguments(
            f"The {_describe_argument(where)} of task {task_name!r} would reach the handler changed: {why}."
        )
    for what, value in [
        *((f"argument {i}", arg) for i, arg in enumerate(args)),
        *((f"argument {name!r}", arg) for name, arg in kwargs.items()),
    ]:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidTask(f"The {what} of task {task_name!r} must be JSON-serializable: {exc}.") from None
    raise InvalidTask(f"The arguments of task {task_name!r} must be JSON-serializable.")


#: Types whose values come back from JSON as they were; one of their subclasses (an IntEnum)
#: comes back as the type it derives from.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _changed_by_json(
    value: Any, tuples_become_lists: bool, path: tuple[Any, ...] = ()
) -> tuple[tuple[Any, ...], str] | None:
    """Where (a path into [args, kwargs]) and how JSON-encodable data would not decode as it
    was; None if it would."""
    if isinstance(value, tuple) and not tuples_become_lists:
        return path, "a tuple decodes as a list (pass a list)"
    if isinstance(value, list | tuple):
        items: Iterable[tuple[Any, Any]] = enumerate(value)
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                return (*path, key), f"the key {key!r} decodes as the string {json.dumps(key)!r}"
        items = value.items()
    elif type(value) not in _SCALARS:
        base = next(t for t in (bool, int, float, str) if isinstance(value, t))
        return path, f"a {type(value).__name__} decodes as a plain {base.__name__}"
    else:
        return None
    for where, item in items:
        if type(item) not in _SCALARS:
            changed = _changed_by_json(item, tuples_become_lists, (*path, where))
            if changed:
                return changed
    return None


def _describe_argument(path: tuple[Any, ...]) -> str:
    """Name a place in [args, kwargs]: "argument 0", "argument 'items' [2]['a']"."""
    if len(path) < 2:
        return "arguments"
    name = f"argument {path[1]}" if path[0] == 0 else f"argument {path[1]!r}"
    return name + "".join(f"[{step!r}]" for step in path[2:])


def _seconds(value: Any, what: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise InvalidTask(f"{what} must be a non-negative number of seconds or a timedelta, not {value!r}.")
    return float(value)


def _instant(value: Any, what: str, now: float) -> float | None:
    """Read a point in time given as an aware or naive datetime, a timedelta from now, or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, timedelta):
        return now + value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise InvalidTask(f"{what} must be a datetime, a timedelta or epoch seconds, not {value!r}.")


def _process_at(opts: dict[str, Any], now: float) -> float | None:
    delay, process_at = opts.get("delay"), opts.get("process_at")
    if delay is not None and process_at is not None:
        raise InvalidTask("Give delay or process_at, not both.")
    if delay is not None:
        return now + _seconds(delay, "delay")
    return _instant(process_at, "process_at", now)

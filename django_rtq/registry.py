"""Task types: the `@task` decorator, the registry of task types, and calls of them as
messages (`prepare`, `enqueue`) or as workflow steps (`s`, `si`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import sending, signals
from .broker.limits import Limit, PartitionLimits
from .broker.message import TaskMessage
from .conf import get_settings
from .discovery import warn_if_unfound
from .message_builder import build_message
from .queue_names import note_task_queue
from .retry import Backoff, resolve_backoff
from .task_options import (
    SCHEDULE_OPTIONS,
    STEP_OPTIONS,
    TYPE_OPTIONS,
    USING_OPTIONS,
    check_options,
    check_partition_by,
    check_partition_name,
    check_queue,
    check_schedule,
    partition_limits,
    task_limit,
)

_registry: dict[str, TaskType] = {}
#: Old names of task types (`@task(aliases=[...])`) -> their current names.
_aliases: dict[str, str] = {}
#: Bumped at each registration, so that what is derived from the registry knows to start over.
_generation = 0


@dataclass(frozen=True, slots=True, eq=False)  # hashable by identity: it is a signal sender
class TaskType:
    """A registered task function, with its options. Call it to run the function directly."""

    func: Callable[..., Any]
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    #: names it had before (its module moved, it was renamed): tasks queued under them run as it
    aliases: tuple[str, ...] = ()
    is_async: bool = field(init=False)  # an `async def` function
    # its flow-control limits (`rate_limit`, `burst`, `max_concurrency`), if it has any
    limit: Limit | None = field(init=False, repr=False)
    # the limits of its partitions (`partition_max_concurrency`, ..., `partition_limits`), if any
    partition_limits: PartitionLimits | None = field(init=False, repr=False)
    # what its options and the settings decide for every call (message_builder.CallPlan)
    call_plan: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.func))
        object.__setattr__(self, "limit", task_limit(self.options, self.name))
        object.__setattr__(self, "partition_limits", partition_limits(self.options, self.name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __getattr__(self, attribute: str) -> Any:
        # Only for names the type does not have: Celery's get a pointer to django-rtq's own.
        hint = CELERY_NAMES.get(attribute)
        if hint is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attribute!r}")
        call = getattr(self.func, "__name__", "task")
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {attribute!r} (Celery's name): "
            f"{hint.format(task=call)}. docs/celery.md maps Celery's names to django-rtq's."
        )

    @property
    def exposed(self) -> bool:
        """Whether the REST API may enqueue this task type (`@task(expose=True)`)."""
        return bool(self.options.get("expose"))

    @property
    def retry_backoff(self) -> Backoff:
        return resolve_backoff(self.options.get("retry_backoff") or get_settings().RETRY_BACKOFF)

    def using(self, **options: Any) -> TaskType:
        """Return this task type with options overridden for the calls made through it."""
        check_options(options, USING_OPTIONS, self.name)
        return replace(self, options={**self.options, **options})

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A call of this task as a workflow step; it receives the previous step's result first."""
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """A call of this task as a workflow step that ignores the previous step's result."""
        return Signature(self, args, kwargs, immutable=True)

    def prepare(self, *args: Any, **kwargs: Any) -> TaskMessage:
        """Build (and validate) the message an enqueue of these arguments would send."""
        warn_if_unfound(self.name, self.func)
        return build_message(self, args, kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> TaskMessage:
        """Enqueue a call of this task; return its message (`.id` identifies it)."""
        message = self.prepare(*args, **kwargs)
        landed = sending.enqueue([message], announce=announce_enqueued)
        return _with_landed_ids([message], landed)[0]

    def enqueue_on_commit(self, *args: Any, **kwargs: Any) -> TaskMessage:
        """Enqueue once the current database transaction commits (at once outside one). The
        task is stored in the transaction meanwhile, so that it is sent even if Redis is away
        at the commit (the transactional outbox: django_rtq/outbox.py)."""
        message = self.prepare(*args, **kwargs)
        sending.enqueue([message], announce=announce_enqueued, on_commit=True)
        return message


STEP_HINT = "use {task}.s(*args, **kwargs) for a workflow step, or .si(...) to ignore the previous result"
#: Celery's names for what a task type does, and how django-rtq says it (`TaskType.__getattr__`).
CELERY_NAMES = {
    "delay": "use {task}.enqueue(*args, **kwargs)",
    "apply_async": (
        "use {task}.enqueue(*args, **kwargs), or with options "
        "{task}.using(delay=seconds, queue=..., priority=...).enqueue(*args, **kwargs) "
        "(countdown= is delay=, eta= is process_at=)"
    ),
    "apply": "call it, {task}(*args, **kwargs), to run it here",
    "signature": STEP_HINT,
    "subtask": STEP_HINT,
    "AsyncResult": "look a task up with Operations().get_task(task_id)",
    "retry": "raise an exception in the task to have it retried (@task(max_retries=...))",
}


@dataclass(frozen=True)
class Signature:
    """A call of a task type, to run as a workflow step: `add.s(2, 3)`. Unless made with
    `.si()` it receives the previous step's result as its first argument. The workflows
    (django_rtq.workflows) compose signatures into chains, groups and the rest."""

    task_type: TaskType
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    immutable: bool = False

    def using(self, **options: Any) -> Signature:
        """This call with options (queue, priority, max_retries, timeout, delay, ...)."""
        check_options(options, STEP_OPTIONS, self.task_type.name)
        return Signature(self.task_type, self.args, self.kwargs, {**self.options, **options}, self.immutable)

    @property
    def queue(self) -> str:
        return (
            self.options.get("queue") or self.task_type.options.get("queue") or get_settings().DEFAULT_QUEUE
        )

    def node(self) -> dict[str, Any]:
        """This step as a node of a workflow: the JSON-able dict the planner reads."""
        return {
            "t": "task",
            "task": self.task_type.name,
            "args": list(self.args),
            "kwargs": self.kwargs,
            "options": self.options,
            "immutable": self.immutable,
            "queue": self.queue,
        }


def enqueue_many(messages: Iterable[TaskMessage]) -> list[TaskMessage]:
    """Enqueue prepared messages in one round trip (`my_task.prepare(...)` makes them)."""
    messages = list(messages)
    return _with_landed_ids(messages, sending.enqueue(messages, announce=announce_enqueued))


def _with_landed_ids(messages: list[TaskMessage], landed: list[TaskMessage]) -> list[TaskMessage]:
    """The messages given, each debounced one merged into the copy that waits with that copy's
    id (docs/debounce.md): the handle the caller gets is of the task that will run."""
    return [m if m.id == to.id else replace(m, id=to.id) for m, to in zip(messages, landed, strict=True)]


def announce_enqueued(messages: Sequence[TaskMessage]) -> None:
    """Send `task_enqueued` for each message (nothing to do, and no cost, without receivers)."""
    if signals.task_enqueued.receivers:
        for message in messages:
            signals.task_enqueued.send(_registry.get(message.task), message=message)


def find_task_type(name: str) -> TaskType | None:
    """Return the task type registered under `name`, or else the one a dotted path names: a
    `django.tasks` task run by django-rtq is registered when its module is first imported."""
    task_type = _registry.get(name) or _registry.get(_aliases.get(name, ""))
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


def task(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    aliases: Iterable[str] = (),
    **options: Any,
) -> Any:
    """Register a function as a task type: `@task` or `@task(queue="emails", max_retries=3)`.

    `aliases` are names the type had before (`["shop.tasks.send_mail"]` once it moved to
    `mail.tasks`): tasks queued under them run as this type (docs/deploying.md).
    """

    def register(func: Callable[..., Any]) -> TaskType:
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        check_options(options, TYPE_OPTIONS, task_name)
        if name is None:
            _check_importable(func, task_name)
        task_type = TaskType(
            func=func, name=task_name, options=dict(options), aliases=_check_aliases(aliases)
        )
        if "queue" in options:
            check_queue(options["queue"], task_name)
        if "retry_backoff" in options:
            resolve_backoff(options["retry_backoff"])
        check_partition_by(options.get("partition_by"), func, task_name)
        if options.get("partition") is not None:
            try:
                check_partition_name(options["partition"], f"Task {task_name!r}: partition")
            except ValueError as exc:
                raise ImproperlyConfigured(str(exc)) from None
        if not SCHEDULE_OPTIONS.isdisjoint(options):
            check_schedule(task_name, cron=options.get("cron"), every=options.get("every"))
            if options.get("debounce") is not None:
                raise ImproperlyConfigured(
                    f"Periodic task {task_name!r} cannot be debounced: each tick runs once already."
                )
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
    for alias in task_type.aliases:
        claimed_by = _registry.get(alias) or _registry.get(_aliases.get(alias, ""))
        if claimed_by is not None and claimed_by.name != task_type.name:
            raise ImproperlyConfigured(
                f"Task {task_type.name!r} cannot take the alias {alias!r}: it names the task type "
                f"{claimed_by.name!r}. An alias must be a name no other task type has."
            )
    if task_type.name in _aliases and _aliases[task_type.name] != task_type.name:
        raise ImproperlyConfigured(
            f"Task name {task_type.name!r} is an alias of {_aliases[task_type.name]!r}. "
            "Give one of them another name."
        )
    global _generation
    _registry[task_type.name] = task_type
    _aliases.update(dict.fromkeys(task_type.aliases, task_type.name))
    _generation += 1
    queue = task_type.options.get("queue")
    if queue:
        note_task_queue(queue)


def unregister_task(name: str) -> None:
    """Take a task type and its aliases out of the registry, as if it had never been registered."""
    global _generation
    task_type = _registry.pop(name, None)
    for alias in task_type.aliases if task_type else ():
        _aliases.pop(alias, None)
    _generation += 1


def _check_importable(func: Callable[..., Any], task_name: str) -> None:
    """A task named by its path must be importable by it: a worker imports it so (discovery.py)."""
    qualname = getattr(func, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        what = (
            "a lambda" if "<lambda>" in qualname.rpartition(".")[2] else "a function defined inside another"
        )
        raise ImproperlyConfigured(
            f"@task cannot take {what} ({task_name}): a worker imports a task type by its dotted "
            "path, and that of a lambda or of a nested function cannot be imported. Define it at "
            "the top level of a module (the app's tasks.py), or give it a name, @task(name=...), in "
            "a module the workers import at start-up."
        )


def _check_aliases(aliases: Iterable[str]) -> tuple[str, ...]:
    if isinstance(aliases, str):
        raise ImproperlyConfigured(f"aliases must be a list of task names, not the string {aliases!r}.")
    names = tuple(aliases)
    for alias in names:
        if not isinstance(alias, str) or not alias:
            raise ImproperlyConfigured(f"A task alias must be a non-empty string, not {alias!r}.")
    return names


def registry_generation() -> int:
    """A number that changes whenever a task type is registered."""
    return _generation


def get_task_type(name: str) -> TaskType | None:
    """The task type registered under `name`, or that has it as an alias."""
    return _registry.get(name) or _registry.get(_aliases.get(name, ""))


def registered_tasks() -> dict[str, TaskType]:
    return dict(_registry)


def periodic_task_types() -> list[TaskType]:
    """Return the task types declared periodic with `@task(cron=...)` or `@task(every=...)`."""
    return [t for t in _registry.values() if not SCHEDULE_OPTIONS.isdisjoint(t.options)]


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"

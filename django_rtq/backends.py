"""A `django.tasks` backend: functions decorated with Django's `@task` run under `rtq_worker`.

    TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend", "QUEUES": ["default"]}}

On Django 5.2 the `django-tasks` backport provides the same API (`django_tasks`).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, fields, replace
from datetime import datetime
from functools import wraps
from inspect import iscoroutinefunction
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from . import sending
from . import signals as rtq_signals
from .broker.attempt import AttemptInfo
from .broker.message import TaskMessage
from .broker.states import TaskState
from .conf import LIMIT_OPTIONS, get_settings, validate_queue_name
from .connection import queue_time
from .context import TaskContext as RTQContext
from .context import current_task
from .exceptions import BrokerUnavailable, InvalidArguments, InvalidTask, TaskNotFound
from .formats import django_datetime
from .message_builder import build_message
from .operations import Operations
from .registry import TaskType, get_task_type, register_task
from .task_view import TaskView, task_view

try:  # Django 6.0+
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask as DjangoInvalidTask
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2 with the django-tasks backport
    from .extras import require_extra

    require_extra("tasks-backport", "django_rtq.backends (the django.tasks backend, on Django 5.2)")
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as DjangoInvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

#: Live states as `django.tasks` reports them.
STATUS_OF_STATE = {
    TaskState.PENDING: TaskResultStatus.READY,
    TaskState.SCHEDULED: TaskResultStatus.READY,
    TaskState.RETRY: TaskResultStatus.READY,
    TaskState.ACTIVE: TaskResultStatus.RUNNING,
    TaskState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    TaskState.ARCHIVED: TaskResultStatus.FAILED,
    TaskState.WAITING: TaskResultStatus.RUNNING,  # a workflow, waiting for its children
}

#: The statuses of a task that has finished.
FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)

#: Keys of a backend's OPTIONS that are defaults for its tasks, over RTQ's own.
BACKEND_OPTIONS = {"MAX_RETRIES": "max_retries", "TIMEOUT": "timeout", "RETENTION": "retention"}
#: The backend's other OPTIONS: "OUTBOX": True sends a task enqueued in a transaction after the
#: commit, through the transactional outbox (django_rtq/outbox.py).
BACKEND_SWITCHES = ("OUTBOX",)
#: `django.tasks` has no retries: unless a task or the backend's OPTIONS say otherwise, none.
DEFAULT_MAX_RETRIES = 0
#: Tasks whose task type a backend keeps once validated (more are rare: then it starts over).
KNOWN_TASKS = 256
#: RTQTask's own options: a task that differs from another in none of them (nor in its function)
#: is the same definition, whatever its queue, priority, run_after or backend (`using()`).
RTQ_FIELDS = (
    "max_retries", "timeout", "retention", "retry_backoff", "unique", "unique_key", "debounce",
    "debounce_key", "rate_limit", "burst", "max_concurrency", "takes_context",
)  # fmt: skip


class InvalidTaskArguments(DjangoInvalidTask, InvalidArguments):
    """Arguments a task cannot be enqueued with: Django's InvalidTask, and the TypeError that
    Django's documentation shows for an argument that is not JSON."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RTQTask(Task):
    """A `django.tasks` Task that also takes django-rtq's options:
    `@task(max_retries=3, timeout=60, unique=True, retention=3600)`, and flow control:
    `@task(rate_limit="20/s", burst=40, max_concurrency=3)`."""

    max_retries: int | None = None
    timeout: float | None = None
    retention: float | None = None
    retry_backoff: Any = None
    unique: bool | float = False
    unique_key: str | None = None
    debounce: float | None = None  # docs/debounce.md
    debounce_key: Any = None  # a string, or a function of the call's arguments that returns one
    rate_limit: str | None = None
    burst: int | None = None
    max_concurrency: int | None = None

    @property
    def rtq_task_type(self) -> TaskType:
        """The django-rtq task type that runs this task (the worker finds it by `module_path`)."""
        backend = self.get_backend()
        options: dict[str, Any] = {
            "queue": self.queue_name,
            "priority": self.priority,
            **backend.task_defaults,
        }
        for name in (
            "max_retries", "timeout", "retention", "retry_backoff", "unique_key", "debounce", "debounce_key",
            *LIMIT_OPTIONS,
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        if self.unique:
            options["unique"] = self.unique
        return TaskType(func=_runner(self), name=self.module_path, options=options)


class RTQBackend(BaseTaskBackend):
    """Enqueues `django.tasks` tasks to django-rtq; results come from Redis while the task is
    live, then from the ORM mirror of finished tasks."""

    task_class = RTQTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        for queue in self.queues:
            validate_queue_name(queue)
        known = (*BACKEND_OPTIONS, *BACKEND_SWITCHES)
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            raise ImproperlyConfigured(
                f"Unknown OPTIONS for the tasks backend {alias!r}: {', '.join(unknown)}. "
                f"Known: {', '.join(known)}."
            )
        self.outbox = self.options.get("OUTBOX", False)
        if not isinstance(self.outbox, bool):
            raise ImproperlyConfigured(
                f"OPTIONS['OUTBOX'] of the tasks backend {alias!r} must be True or False, "
                f"not {self.outbox!r}."
            )
        self.task_defaults = {"max_retries": DEFAULT_MAX_RETRIES}
        self.task_defaults.update(
            {BACKEND_OPTIONS[key]: value for key, value in self.options.items() if key in BACKEND_OPTIONS}
        )
        # Tasks and backends are immutable: a task validated once stays valid, and its task
        # type is the same every time. Kept per task, up to KNOWN_TASKS of them.
        self._known_task_types: dict[Task, TaskType] = {}

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if isinstance(task, RTQTask):
            _register(task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        known: dict[Task, TaskType] | None = self._known_task_types
        try:
            task_type = known.get(task)
        except TypeError:  # an option of the task is not hashable: nothing kept
            task_type = known = None
        if task_type is None:
            self.validate_task(task)
            task_type = _task_type(task)
            if known is not None:
                if len(known) >= KNOWN_TASKS:
                    known.clear()
                known[task] = task_type
        if task.run_after is not None:
            task_type = task_type.using(process_at=task.run_after)
        try:
            # Django's own backends hand the handler tuples as lists, and so does this one.
            message = build_message(task_type, args, kwargs, tuples_become_lists=True)
        except InvalidArguments as exc:  # not JSON, or not the function's: a TypeError too
            raise InvalidTaskArguments(str(exc)) from exc
        except InvalidTask as exc:
            raise DjangoInvalidTask(str(exc)) from exc
        if self.outbox:
            sending.enqueue([message], announce=_nothing_to_announce, on_commit=True)
            result = _ready_result(task, message, message.id, self.alias)
            # Enqueued once the transaction commits, if it does (at once outside one).
            transaction.on_commit(
                lambda: task_enqueued.send(type(self), task_result=result),
                using=get_settings().OUTBOX_DATABASE,
            )
        else:
            landed = sending.enqueue([message], announce=_nothing_to_announce)[0]
            # built once sent, not before: an idle worker starts the task meanwhile. A debounced
            # task merged into the copy that waits has that copy's id.
            result = _ready_result(task, message, landed.id, self.alias)
            task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result: live in Redis, else finished (in the mirror's buffer or the ORM)."""
        try:
            found = Operations().find_task(result_id)
        except TaskNotFound:
            return self._result_from_outbox(result_id)
        except BrokerUnavailable:
            try:  # while Redis is away, the tasks the outbox keeps are known all the same
                return self._result_from_outbox(result_id)
            except TaskResultDoesNotExist:
                pass
            raise
        view = task_view(found)
        if view.live and view.message is None:
            raise TaskResultDoesNotExist(f"Task {result_id!r} has a message that cannot be read.")
        return self._result(view)

    def _result_from_outbox(self, result_id: str) -> TaskResult:
        """A task stored in the outbox, not in Redis yet (Redis was away at the commit)."""
        row = Operations().outbox_tasks().filter(task_id=result_id).first()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            message = TaskMessage.from_json(row.message, id=row.task_id, queue=row.queue)
        except ValueError:
            raise TaskResultDoesNotExist(f"Task {result_id!r} has a message that cannot be read.") from None
        task = _as_enqueued(
            _module_task(result_id, message.task),
            queue=message.queue,
            priority=message.priority,
            process_at=message.process_at,
        )
        return _ready_result(task, message, result_id, task.backend)

    def _result(self, view: TaskView) -> TaskResult:
        """A task's view as Django reads a result: a running attempt is the latest one, begun
        when its run began (`TaskView.running_since`), the first one unless an earlier one ran."""
        status = STATUS_OF_STATE[view.state]
        last_attempted_at = view.running_since or view.last_attempted_at
        started_at = view.started_at or view.running_since
        task = _as_enqueued(
            _module_task(view.id, view.task or ""),
            queue=view.queue,
            priority=view.priority,
            process_at=view.process_at.timestamp() if view.process_at else None,
        )
        result = TaskResult(
            task=task,
            id=view.id,
            status=status,
            enqueued_at=_django_time(view.enqueued_at),
            started_at=_django_time(started_at),
            finished_at=_django_time(view.finished_at) if status in FINISHED else None,
            last_attempted_at=_django_time(last_attempted_at),
            args=view.args,
            kwargs=view.kwargs,
            backend=task.backend,
            errors=_task_errors(view.error_records),
            worker_ids=view.workers,
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", view.result)
        return result


def _ready_result(task: Task, message: TaskMessage, result_id: str, backend: str) -> TaskResult:
    """A task READY, as its message was sent (or kept in the outbox)."""
    return TaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus.READY,
        enqueued_at=django_datetime(message.enqueued_at),
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=message.args,
        kwargs=message.kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
    )


def _module_task(result_id: str, task_name: str) -> Task:
    """The task a stored task name names, as its module defines it."""
    try:
        task = import_string(task_name)
    except ImportError:
        task = None
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(f"Task {result_id!r} ({task_name}) is not a django.tasks task.")
    return task


def _as_enqueued(task: Task, *, queue: str, priority: int, process_at: float | None) -> Task:
    """The task as it was enqueued (a `using()` variant of `task`), from what its message keeps:
    its queue, priority and run_after."""
    run_after = django_datetime(process_at) if process_at is not None else None
    if (task.queue_name, task.priority, task.run_after) == (queue, priority, run_after):
        return task
    return replace(task, queue_name=queue, priority=priority, run_after=run_after)


#: The task each name was registered for, by `_register`.
_registered: dict[str, RTQTask] = {}


def _register(task: RTQTask) -> None:
    """Register a task's type as soon as its module is imported, so that a worker knows it. A
    `using()` variant of the registered task (the same function and options, another queue,
    priority, run_after or backend) registers nothing: the process-wide type keeps the task's
    own defaults, and a running task learns its variant from its message (`_as_enqueued`)."""
    name = task.module_path
    known = _registered.get(name)
    if (
        known is not None
        and known.func is task.func
        and all(getattr(known, option) == getattr(task, option) for option in RTQ_FIELDS)
        and get_task_type(name) is not None
    ):
        return
    register_task(task.rtq_task_type)
    _registered[name] = task


def _nothing_to_announce(messages: Any) -> None:
    """Django's `task_enqueued` is sent for the backend's tasks (by `enqueue`), not django-rtq's."""


def _task_type(task: Task) -> TaskType:
    if isinstance(task, RTQTask):
        return task.rtq_task_type
    # A plain django.tasks Task bound to this backend by `using(backend=...)`.
    return RTQTask(
        func=task.func,
        priority=task.priority,
        backend=task.backend,
        queue_name=task.queue_name,
        run_after=task.run_after,
        takes_context=task.takes_context,
    ).rtq_task_type


def _task_errors(records: list[dict[str, Any]]) -> list[TaskError]:
    """Recorded errors ({"type", "message", "traceback"}) as Django's."""
    return [
        TaskError(exception_class_path=error.get("type") or "", traceback=error.get("traceback") or "")
        for error in records
    ]


def _django_time(moment: datetime | None) -> datetime | None:
    """A view's time as Django keeps times: naive local time without USE_TZ."""
    if moment is None or settings.USE_TZ or timezone.is_naive(moment):
        return moment
    return timezone.make_naive(moment)


def _running_result(task: Task, context: RTQContext | None, args: list, kwargs: dict) -> TaskResult:
    """The TaskResult of the attempt `context` describes, running: the task as it was enqueued,
    its earlier attempts' errors and workers, this one's worker and start."""
    if context is None:  # called outside a worker (django_rtq.testing runs set a context)
        return TaskResult(
            task=task, id="", status=TaskResultStatus.RUNNING, enqueued_at=None, started_at=None,
            finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
            backend=task.backend, errors=[], worker_ids=[],
        )  # fmt: skip
    started = django_datetime(context.started_at)
    task = _as_enqueued(task, queue=context.queue, priority=context.priority, process_at=context.process_at)
    if context.info:
        attempt = AttemptInfo.from_mapping(context.info)
        first_started = django_datetime(attempt.started_at) or started  # of an earlier attempt, if one ran
        errors, workers = _task_errors(attempt.error_records), [*attempt.workers, context.worker_id]
    else:  # a first attempt (most of them): nothing earlier to read
        first_started, errors, workers = started, [], [context.worker_id]
    return TaskResult(
        task=task,
        id=context.id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=django_datetime(context.enqueued_at),
        started_at=first_started,
        finished_at=None,
        last_attempted_at=started,
        args=args,  # normalised to a list, as kwargs to a new dict, by TaskResult
        kwargs=kwargs,
        backend=task.backend,
        errors=errors,
        worker_ids=workers,
    )


#: The RUNNING result the runner sent with task_started, per executor thread (an async task runs
#: on its thread's loop), as (the attempt's context, the result): its task_finished copies it.
_attempts = threading.local()
_RESULT_FIELDS = tuple(f.name for f in fields(TaskResult))


def _finished_result(
    running: TaskResult, status: TaskResultStatus, finished_at: datetime | None
) -> TaskResult:
    """A copy of a RUNNING result with its end: Django's constructor would normalise the
    arguments again, which the running result already holds normalised."""
    finished = object.__new__(TaskResult)
    for name in _RESULT_FIELDS:
        object.__setattr__(finished, name, getattr(running, name))
    object.__setattr__(finished, "status", status)
    object.__setattr__(finished, "finished_at", finished_at)
    return finished


def _runner(task: RTQTask) -> Any:
    """The function a worker calls: the task's own, given its context if it takes one, with
    Django's task_started sent before it. Django's task_finished is sent once the worker has
    settled the attempt (`_send_succeeded`, `_send_failed`)."""
    func = task.func

    def started(args: tuple, kwargs: dict) -> tuple:
        context = current_task()
        result = _running_result(task, context, list(args), kwargs)
        _attempts.running = (context, result)
        task_started.send(RTQBackend, task_result=result)
        return (TaskContext(task_result=result), *args) if task.takes_context else args

    if iscoroutinefunction(func):

        @wraps(func)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            return await func(*started(args, kwargs), **kwargs)

        run_async.django_task = task  # type: ignore[attr-defined]
        return _called_without_context(run_async, task)

    @wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        return func(*started(args, kwargs), **kwargs)

    run.django_task = task  # type: ignore[attr-defined]
    return _called_without_context(run, task)


def _django_task(task_type: TaskType | None) -> RTQTask | None:
    """The `django.tasks` task a django-rtq task type runs, if it runs one."""
    return getattr(task_type.func, "django_task", None) if task_type is not None else None


def _send_succeeded(sender: TaskType | None, message: TaskMessage, result: Any, **kwargs: Any) -> None:
    """Django's task_finished for an attempt that returned a value the worker could keep (a value
    that is not JSON fails the task instead: `_send_failed`). Sent on the executor's thread,
    inside the attempt's context."""
    task, context = _django_task(sender), current_task()
    if task is None or context is None or context.id != message.id:
        return
    started_context, running = getattr(_attempts, "running", (None, None))
    _attempts.running = (None, None)
    if started_context is not context:  # the runner did not start this attempt: a test's call
        running = _running_result(task, context, message.args, message.kwargs)
    finished = _finished_result(running, TaskResultStatus.SUCCESSFUL, django_datetime(queue_time()))
    object.__setattr__(finished, "_return_value", result)
    task_finished.send(RTQBackend, task_result=finished)


def _send_failed(
    sender: TaskType | None, message: TaskMessage | None, info: dict[str, Any], **kwargs: Any
) -> None:
    """Django's task_finished for a task the worker archived: it will not run again, whatever
    retries it had left (the worker's own decision, sent as django-rtq's task_failed)."""
    task = _django_task(sender)
    if task is None or message is None:
        return
    attempt = AttemptInfo.from_mapping(info)
    task = _as_enqueued(task, queue=message.queue, priority=message.priority, process_at=message.process_at)
    finished = TaskResult(
        task=task,
        id=message.id,
        status=TaskResultStatus.FAILED,
        enqueued_at=django_datetime(message.enqueued_at),
        started_at=django_datetime(attempt.started_at),
        finished_at=django_datetime(attempt.failed_at),
        last_attempted_at=django_datetime(attempt.attempted_at),
        args=message.args,
        kwargs=message.kwargs,
        backend=task.backend,
        errors=_task_errors(attempt.error_records),
        worker_ids=list(attempt.workers),
    )
    task_finished.send(RTQBackend, task_result=finished)


rtq_signals.task_succeeded.connect(_send_succeeded, dispatch_uid="django_rtq.backends.task_finished")
rtq_signals.task_failed.connect(_send_failed, dispatch_uid="django_rtq.backends.task_finished")


def _called_without_context(runner: Any, task: Task) -> Any:
    """Give the runner the signature callers call it with: the task function's, less the
    context it passes itself (so that enqueue binds the arguments against it)."""
    if task.takes_context:
        try:
            signature = inspect.signature(task.func)
        except (TypeError, ValueError):
            return runner
        runner.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    return runner

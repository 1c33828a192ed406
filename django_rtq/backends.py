"""A `django.tasks` backend: functions decorated with Django's `@task` run under `rtq_worker`.

    TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend", "QUEUES": ["default"]}}

On Django 5.2 the `django-tasks` backport provides the same API (`django_tasks`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
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
from .broker.attempt import AttemptInfo, error_path, format_traceback, will_retry
from .broker.message import TaskMessage
from .broker.states import TaskState
from .conf import LIMIT_OPTIONS, get_settings, validate_queue_name
from .connection import queue_time
from .context import current_task
from .exceptions import BrokerUnavailable, InvalidArguments, InvalidTask, TaskNotFound
from .formats import django_datetime
from .message_builder import build_message
from .operations import Operations
from .registry import TaskType, register_task
from .task_view import TaskView, task_view

try:  # Django 6.0+
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask as DjangoInvalidTask
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2 with the django-tasks backport
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
            "max_retries", "timeout", "retention", "retry_backoff", "unique_key", *LIMIT_OPTIONS,
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
            # Registered as soon as its module is imported, so that a worker knows it.
            register_task(task.rtq_task_type)

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
        except InvalidArguments:
            raise  # a TypeError, as calling the function with them would raise
        except InvalidTask as exc:
            raise DjangoInvalidTask(str(exc)) from exc
        result = TaskResult(
            task=task,
            id=message.id,
            status=TaskResultStatus.READY,
            enqueued_at=django_datetime(message.enqueued_at),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=message.args,
            kwargs=message.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        if self.outbox:
            sending.enqueue([message], announce=_nothing_to_announce, on_commit=True)
            # Enqueued once the transaction commits, if it does (at once outside one).
            transaction.on_commit(
                lambda: task_enqueued.send(type(self), task_result=result),
                using=get_settings().OUTBOX_DATABASE,
            )
        else:
            sending.enqueue([message], announce=_nothing_to_announce)
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
        task = self._django_task(result_id, message.task)
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
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )

    def _result(self, view: TaskView) -> TaskResult:
        """A task's view as Django reads a result; a running attempt's start is its lease's."""
        status = STATUS_OF_STATE[view.state]
        last_attempted_at = view.last_attempted_at or view.running_since
        started_at = view.started_at or (last_attempted_at if view.state == TaskState.ACTIVE else None)
        result = TaskResult(
            task=self._django_task(view.id, view.task or ""),
            id=view.id,
            status=status,
            enqueued_at=_django_time(view.enqueued_at),
            started_at=_django_time(started_at),
            finished_at=_django_time(view.finished_at) if status in FINISHED else None,
            last_attempted_at=_django_time(last_attempted_at),
            args=view.args,
            kwargs=view.kwargs,
            backend=self.alias,
            errors=_task_errors(view.error_records),
            worker_ids=view.workers,
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", view.result)
        return result

    def _django_task(self, result_id: str, task_name: str) -> Task:
        try:
            task = import_string(task_name)
        except ImportError:
            task = None
        if not isinstance(task, Task):
            raise TaskResultDoesNotExist(f"Task {result_id!r} ({task_name}) is not a django.tasks task.")
        return task


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


def _runner(task: RTQTask) -> Any:
    """The function a worker calls: the task's own, given its context if it takes one, with
    Django's task_started and task_finished signals around it."""
    func = task.func

    def running_result(args: tuple, kwargs: dict) -> TaskResult:
        context = current_task()
        attempt = AttemptInfo.from_mapping(context.info if context else None)
        started = django_datetime(context.started_at) if context else None
        return TaskResult(
            task=task,
            id=context.id if context else "",
            status=TaskResultStatus.RUNNING,
            enqueued_at=django_datetime(context.enqueued_at) if context else None,
            started_at=django_datetime(attempt.started_at) or started,  # of an earlier attempt, if one ran
            finished_at=None,
            last_attempted_at=started,
            args=args,  # normalised to a list, as kwargs to a new dict, by TaskResult
            kwargs=kwargs,
            backend=task.backend,
            errors=_task_errors(attempt.error_records),
            worker_ids=[*attempt.workers, context.worker_id if context else ""],
        )

    def started(args: tuple, kwargs: dict) -> tuple[TaskResult, tuple]:
        result = running_result(args, kwargs)
        task_started.send(RTQBackend, task_result=result)
        return result, ((TaskContext(task_result=result), *args) if task.takes_context else args)

    def finished(result: TaskResult, value: Any = None, error: BaseException | None = None) -> None:
        object.__setattr__(result, "finished_at", django_datetime(queue_time()))
        if error is None:
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(result, "_return_value", value)
        else:
            result.errors.append(
                TaskError(exception_class_path=error_path(error), traceback=format_traceback(error))
            )
            context = current_task()
            if context is not None and will_retry(
                error,
                retried=context.retried,
                max_retries=context.max_retries,
                deadline=context.deadline,
                now=queue_time(),
            ):
                return  # it will run again: not finished
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
        task_finished.send(RTQBackend, task_result=result)

    if iscoroutinefunction(func):

        @wraps(func)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            result, call_args = started(args, kwargs)
            try:
                value = await func(*call_args, **kwargs)
            except BaseException as exc:
                finished(result, error=exc)
                raise
            finished(result, value)
            return value

        return _called_without_context(run_async, task)

    @wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        result, call_args = started(args, kwargs)
        try:
            value = func(*call_args, **kwargs)
        except BaseException as exc:
            finished(result, error=exc)
            raise
        finished(result, value)
        return value

    return _called_without_context(run, task)


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

"""Run a task's handler in the calling thread, as a worker would, for tests."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from .. import signals
from ..broker.attempt import AttemptInfo, format_traceback
from ..broker.message import TaskMessage
from ..context import TaskContext, current_task, set_current_task
from ..exceptions import NonRetryableError
from ..registry import find_task_type

#: The worker id `current_task().worker_id` reads in a task run by the testing helpers.
TEST_WORKER_ID = "django-rtq-testing"

_RESULT_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class TooManyNestedTasks(RuntimeError):
    """Tasks kept enqueueing tasks deeper than the limit (a task that enqueues itself?)."""


@dataclass(frozen=True, slots=True)
class TaskRun:
    """One run of a task's handler: its message, and what it returned or raised."""

    message: TaskMessage
    result: Any = None
    error: BaseException | None = None

    @property
    def succeeded(self) -> bool:
        return self.error is None


def run_message(message: TaskMessage) -> Any:
    """Run the handler of `message` here and now, with `current_task()` set; return its result.

    The arguments are first read back from the message's JSON, as a worker reads them (a tuple
    arrives as a list). A return value that is not JSON fails as it would in a worker
    (`NonRetryableError`). Errors propagate; retries, timeouts and deadlines are not simulated.
    The outcome is sent as a worker sends it, as django-rtq's `task_succeeded` or `task_failed`
    (whose receivers send Django's `task_finished` for a `django.tasks` task).
    """
    task_type = find_task_type(message.task)
    if task_type is None:
        raise LookupError(f"No task type is registered as {message.task!r}: is its module imported?")
    stored = TaskMessage.from_json(message.to_json(), id=message.id, queue=message.queue)
    context = TaskContext(
        id=stored.id,
        task=stored.task,
        queue=stored.queue,
        retried=0,
        max_retries=stored.max_retries,
        worker_id=TEST_WORKER_ID,
        enqueued_at=stored.enqueued_at,
        priority=stored.priority,
        process_at=stored.process_at,
        started_at=time.time(),
        deadline=stored.deadline,
    )
    outer = current_task()
    set_current_task(context)
    try:
        try:
            if task_type.is_async:
                result = _run_coroutine(task_type.func(*stored.args, **stored.kwargs))
            else:
                result = task_type.func(*stored.args, **stored.kwargs)
            try:
                _RESULT_ENCODER.encode(result)
            except (TypeError, ValueError) as exc:
                raise NonRetryableError(f"the task's return value is not JSON-serializable: {exc}") from exc
        except Exception as exc:
            # The first error is the outcome: the task is failed for good, as a worker archives it.
            info = AttemptInfo().failed(
                exc,
                format_traceback(exc),
                worker_id=TEST_WORKER_ID,
                started_at=context.started_at,
                failed_at=time.time(),
                retrying=False,
            )
            _send(signals.task_failed, task_type, message=stored, error=exc, info=info)
            raise
        _send(signals.task_succeeded, task_type, message=stored, result=result)
    finally:
        set_current_task(outer)
    return result


def _send(signal: Any, sender: Any, **kwargs: Any) -> None:
    """Send the outcome's signal as a worker does: a receiver that raises fails nothing."""
    if signal.receivers:
        signal.send_robust(sender, **kwargs)


def _run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run an async handler to its end, also from code that an event loop is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    # asyncio.run() refuses to nest: run it in a thread of its own, with this context (the
    # current task) copied over, and wait for it.
    context = contextvars.copy_context()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = context.run(asyncio.run, coroutine)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="rtq-testing-async")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]

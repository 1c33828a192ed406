"""Capture enqueued tasks instead of sending them to Redis, assert on them, and run them."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction

from .. import sending
from ..broker.message import TaskMessage
from ..conf import get_settings
from ..formats import plural
from .running import TaskRun, TooManyNestedTasks, run_message
from .seam import intercept_enqueues

#: Left unchecked: the default of every field an assertion may check.
UNCHECKED: Any = type("Unchecked", (), {"__repr__": lambda self: "UNCHECKED"})()
#: Seconds two times may differ by and still match (floats of the same instant).
TIME_TOLERANCE = 0.001


def task_name(task: Any) -> str:
    """The registered name of a task given as a `TaskType`, a `django.tasks` task or a name."""
    if isinstance(task, str):
        return task
    name = getattr(task, "name", None)  # a django-rtq TaskType
    if isinstance(name, str) and hasattr(task, "prepare"):
        return name
    module_path = getattr(task, "module_path", None)  # a django.tasks Task
    if isinstance(module_path, str):
        return module_path
    raise TypeError(f"Expected a task (a @task function, a django.tasks task, or a name), not {task!r}.")


def delay_of(message: TaskMessage) -> float | None:
    """Seconds from the enqueue to when the task is due; None for at once."""
    if message.process_at is None:
        return None
    return message.process_at - message.enqueued_at


def describe(message: TaskMessage) -> str:
    """One line saying what a message asks for, as the assertions list it."""
    parts = [f"{message.task}(args={message.args!r}, kwargs={message.kwargs!r})", f"queue={message.queue!r}"]
    delay = delay_of(message)
    if delay is not None:
        parts.append(f"delay={delay:.3f}s")
    if message.priority:
        parts.append(f"priority={message.priority}")
    return " ".join(parts)


class CapturedTasks:
    """The tasks enqueued while capturing, in order (`tasks`), with assertions on them."""

    def __init__(self) -> None:
        self.tasks: list[TaskMessage] = []
        self._depths: list[int] = []  # how deep in tasks enqueuing tasks each one was enqueued
        self._next_to_run = 0
        self._running_depth: int | None = None
        self._lock = threading.Lock()

    def record(self, messages: Sequence[TaskMessage]) -> None:
        """Take the messages of one enqueue call (the interceptor of `capture_tasks`)."""
        depth = 0 if self._running_depth is None else self._running_depth + 1
        with self._lock:
            self.tasks.extend(messages)
            self._depths.extend([depth] * len(messages))

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[TaskMessage]:
        return iter(list(self.tasks))

    def clear(self) -> None:
        """Forget what was captured so far."""
        with self._lock:
            self.tasks.clear()
            self._depths.clear()
            self._next_to_run = 0

    def filter(self, task: Any = None, **fields: Any) -> list[TaskMessage]:
        """The captured messages of `task` (any task if None) whose fields match: `args`,
        `kwargs`, `queue`, `priority`, `delay` (seconds or a timedelta; None: due at once) or
        `process_at` (a datetime or epoch seconds; None: at once)."""
        unknown = sorted(set(fields) - set(_MATCHERS))
        if unknown:
            raise TypeError(
                f"Unknown field(s) {', '.join(unknown)}; expected some of: {', '.join(_MATCHERS)}."
            )
        name = None if task is None else task_name(task)
        return [
            message
            for message in list(self.tasks)
            if (name is None or message.task == name)
            and all(_MATCHERS[field](message, expected) for field, expected in fields.items())
        ]

    def assert_enqueued(
        self,
        task: Any,
        *,
        args: Any = UNCHECKED,
        kwargs: Any = UNCHECKED,
        queue: Any = UNCHECKED,
        priority: Any = UNCHECKED,
        delay: Any = UNCHECKED,
        process_at: Any = UNCHECKED,
        count: int | None = None,
    ) -> TaskMessage:
        """Assert that `task` was enqueued with these fields (those not given are not checked),
        at least once, or exactly `count` times; return the first message that matches."""
        if count is not None and count < 1:
            raise ValueError("count must be 1 or more: assert_not_enqueued() checks that none was.")
        fields = _given(
            args=args, kwargs=kwargs, queue=queue, priority=priority, delay=delay, process_at=process_at
        )
        found = self.filter(task, **fields)
        if found and (count is None or len(found) == count):
            return found[0]
        expected = f"{task_name(task)} to be enqueued"
        if count is not None:
            expected += f" {_times(count)}"
        if fields:
            expected += f" with {_describe_fields(fields)}"
        got = f"it was {_times(len(found))}" if count is not None else "it was not"
        raise AssertionError(f"Expected {expected}, but {got}.\n{self._listing(task, fields)}")

    def assert_not_enqueued(
        self,
        task: Any = None,
        *,
        args: Any = UNCHECKED,
        kwargs: Any = UNCHECKED,
        queue: Any = UNCHECKED,
        priority: Any = UNCHECKED,
        delay: Any = UNCHECKED,
        process_at: Any = UNCHECKED,
    ) -> None:
        """Assert that no task (or no call of `task` with these fields) was enqueued."""
        fields = _given(
            args=args, kwargs=kwargs, queue=queue, priority=priority, delay=delay, process_at=process_at
        )
        found = self.filter(task, **fields)
        if not found:
            return
        what = "no task" if task is None else f"no {task_name(task)}"
        if fields:
            what += f" with {_describe_fields(fields)}"
        lines = "\n".join(f"  - {describe(message)}" for message in found)
        raise AssertionError(f"Expected {what} to be enqueued, but found {_times(len(found))}:\n{lines}")

    def waiting_for_commit(self) -> list[TaskMessage]:
        """The tasks enqueued on commit (`enqueue_on_commit()`, the `django.tasks` backend with
        `OUTBOX: True`) while capturing, whose transaction has not committed yet: they are
        captured once it does (and never if it rolls back)."""
        waiting = []
        for connection in connections.all(initialized_only=True):
            for _, callback, _ in connection.run_on_commit:
                if isinstance(callback, _WaitingForCommit) and callback.captured is self and not callback.ran:
                    waiting.extend(callback.messages)
        return waiting

    def _listing(self, task: Any, fields: dict[str, Any]) -> str:
        """What was enqueued, each with the fields that differ from those expected."""
        waiting = self._waiting_note()
        if not self.tasks:
            return "Nothing was enqueued." + waiting
        name = task_name(task)
        lines = [f"Enqueued ({len(self.tasks)}):"]
        for message in list(self.tasks):
            line = f"  - {describe(message)}"
            if message.task == name:
                differ = [
                    field for field, expected in fields.items() if not _MATCHERS[field](message, expected)
                ]
                if differ:
                    line += f"  [differs: {', '.join(differ)}]"
            lines.append(line)
        return "\n".join(lines) + waiting

    def _waiting_note(self) -> str:
        waiting = self.waiting_for_commit()
        if not waiting:
            return ""
        lines = "\n".join(f"  - {describe(message)}" for message in waiting)
        return (
            f"\n{plural(len(waiting), 'task')} enqueued on commit "
            f"{'waits' if len(waiting) == 1 else 'wait'} for a commit that has not happened "
            f"(a test's transaction never commits):\n{lines}\n"
            "Run the on-commit callbacks to capture them: with TestCase.captureOnCommitCallbacks("
            "execute=True), or pytest-django's django_capture_on_commit_callbacks(execute=True) "
            "fixture, around the code that enqueues; or use a transactional test "
            "(TransactionTestCase, @pytest.mark.django_db(transaction=True))."
        )

    def run_all(self, *, max_depth: int = 10, raise_errors: bool = True) -> list[TaskRun]:
        """Run the handlers of the tasks captured and not run yet, in order, here, with
        `current_task()` set; then those they enqueued, and so on, `max_depth` deep at most.

        Delays are not waited for and retries not simulated. An error propagates unless
        `raise_errors` is False; then it is in the returned `TaskRun`.
        """
        runs: list[TaskRun] = []
        while True:
            with self._lock:
                if self._next_to_run >= len(self.tasks):
                    return runs
                message, depth = self.tasks[self._next_to_run], self._depths[self._next_to_run]
                self._next_to_run += 1
            if depth > max_depth:
                raise TooManyNestedTasks(
                    f"Tasks enqueued tasks more than {max_depth} deep (now {describe(message)}): "
                    f"does a task enqueue itself? Pass a larger max_depth if this is meant."
                )
            self._running_depth = depth
            try:
                runs.append(TaskRun(message, result=run_message(message)))
            except Exception as exc:
                if raise_errors:
                    raise
                runs.append(TaskRun(message, error=exc))
            finally:
                self._running_depth = None


@contextmanager
def capture_tasks() -> Iterator[CapturedTasks]:
    """Capture every task enqueued inside the block, from any thread, instead of sending it to
    Redis: `with capture_tasks() as captured: ...; captured.assert_enqueued(send_receipt, args=[42])`.
    A task enqueued on commit is captured once its transaction commits; until then the
    assertions list it as waiting for a commit."""
    captured = CapturedTasks()
    with intercept_enqueues(captured.record), _noting_on_commit(captured):
        yield captured


class _WaitingForCommit:
    """An on-commit callback that marks, in the connection's list of callbacks, tasks enqueued on
    commit while capturing. Django drops it with its savepoint's rollback; run, it notes that the
    callbacks before it ran (`captureOnCommitCallbacks(execute=True)` runs them and keeps them listed)."""

    def __init__(self, captured: CapturedTasks, messages: Sequence[TaskMessage]) -> None:
        self.captured = captured
        self.messages = list(messages)
        self.ran = False

    def __call__(self) -> None:
        self.ran = True


_noting_lock = threading.RLock()
_noting: list[CapturedTasks] = []
_original_sending_enqueue = sending.enqueue


def _enqueue_noting_on_commit(
    messages: Sequence[TaskMessage], *, announce: Any, on_commit: bool = False
) -> list[TaskMessage]:
    landed = _original_sending_enqueue(messages, announce=announce, on_commit=on_commit)
    using = get_settings().OUTBOX_DATABASE
    if on_commit and connections[using].in_atomic_block:
        with _noting_lock:
            captured = _noting[-1] if _noting else None
        if captured is not None:
            transaction.on_commit(_WaitingForCommit(captured, messages), using=using)
    return landed


@contextmanager
def _noting_on_commit(captured: CapturedTasks) -> Iterator[None]:
    """Note the tasks enqueued on commit inside the block, for `CapturedTasks.waiting_for_commit`."""
    with _noting_lock:
        if not _noting:
            sending.enqueue = _enqueue_noting_on_commit
        _noting.append(captured)
    try:
        yield
    finally:
        with _noting_lock:
            _noting.remove(captured)
            if not _noting:
                sending.enqueue = _original_sending_enqueue


def _given(**fields: Any) -> dict[str, Any]:
    return {field: value for field, value in fields.items() if value is not UNCHECKED}


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _describe_fields(fields: dict[str, Any]) -> str:
    return ", ".join(f"{field}={value!r}" for field, value in fields.items())


def _seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _instant(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


def _matches_delay(message: TaskMessage, expected: Any) -> bool:
    actual = delay_of(message)
    if expected is None or actual is None:
        return expected is None and actual is None
    return abs(actual - _seconds(expected)) <= TIME_TOLERANCE


def _matches_process_at(message: TaskMessage, expected: Any) -> bool:
    if expected is None or message.process_at is None:
        return expected is None and message.process_at is None
    return abs(message.process_at - _instant(expected)) <= TIME_TOLERANCE


_MATCHERS = {
    "args": lambda message, expected: message.args == list(expected),
    "kwargs": lambda message, expected: message.kwargs == dict(expected),
    "queue": lambda message, expected: message.queue == expected,
    "priority": lambda message, expected: message.priority == expected,
    "delay": _matches_delay,
    "process_at": _matches_process_at,
}

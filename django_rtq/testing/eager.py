"""Run tasks eagerly: an enqueue runs the task's handler at once, in the caller."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..broker.message import TaskMessage
from .running import TaskRun, TooManyNestedTasks, run_message
from .seam import intercept_enqueues


class EagerRuns:
    """The runs of the tasks enqueued while running eagerly, in the order they finished (a task
    enqueued by another, and so run inside it, finishes first)."""

    def __init__(self, *, propagate: bool, max_depth: int) -> None:
        self.runs: list[TaskRun] = []
        self.propagate = propagate
        self.max_depth = max_depth
        self._depth = threading.local()  # tasks enqueued by tasks run inside the enqueue

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[TaskRun]:
        return iter(list(self.runs))

    @property
    def results(self) -> list[object]:
        """The return values of the runs that succeeded, in order."""
        return [run.result for run in self.runs if run.succeeded]

    @property
    def errors(self) -> list[BaseException]:
        """The errors of the runs that failed (kept when `propagate` is False), in order."""
        return [run.error for run in self.runs if run.error is not None]

    def run(self, messages: Sequence[TaskMessage]) -> None:
        """Run each message's handler now (the interceptor of `run_eagerly`)."""
        depth = getattr(self._depth, "value", 0)
        if depth >= self.max_depth:
            raise TooManyNestedTasks(
                f"Tasks enqueued tasks more than {self.max_depth} deep, each run at once: does a "
                f"task enqueue itself? Pass a larger max_depth if this is meant."
            )
        for message in messages:
            self._depth.value = depth + 1
            try:
                result = run_message(message)
            except TooManyNestedTasks:
                raise
            except Exception as exc:
                self.runs.append(TaskRun(message, error=exc))
                if self.propagate:
                    raise
            else:
                self.runs.append(TaskRun(message, result=result))
            finally:
                self._depth.value = depth


@contextmanager
def run_eagerly(*, propagate: bool = True, max_depth: int = 10) -> Iterator[EagerRuns]:
    """Inside the block, every enqueue runs the task at once, in the caller, instead of sending
    it to Redis; nothing is stored. A handler's error propagates from the enqueue unless
    `propagate` is False (then it is recorded). Retries, delays, timeouts and uniqueness are not
    simulated: see docs/testing.md."""
    runs = EagerRuns(propagate=propagate, max_depth=max_depth)
    with intercept_enqueues(runs.run):
        yield runs

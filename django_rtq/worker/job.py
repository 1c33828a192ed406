"""A claimed task as the processor tracks it, and the outcome of running it."""

from __future__ import annotations

import asyncio
import ctypes
import enum
import threading
import time
from dataclasses import dataclass, field

from ..broker import ClaimedTask, TaskMessage
from ..registry import TaskType
from .outcome import Failure


class JobState(enum.Enum):
    """Where a claimed task is inside the processor."""

    QUEUED = "queued"  # claimed, waiting for a free thread
    RUNNING = "running"
    CANCELLED = "cancelled"  # cancellation asked for before it started
    DONE = "done"  # handler returned; outcome waits to be settled
    ABANDONED = "abandoned"  # timed out, cancelled while running, or given back unstarted
    STOPPED = "stopped"  # its handler was stopped (shutdown, lost lease); nothing to settle


@dataclass(eq=False, slots=True, kw_only=True)
class Job:
    """A claimed task as the processor tracks it until its outcome is settled."""

    claimed: ClaimedTask
    message: TaskMessage
    task_type: TaskType
    state: JobState = JobState.QUEUED
    thread: threading.Thread | None = None
    started_at: float | None = None  # epoch seconds
    expires_at: float | None = None  # time.monotonic() at which the watchdog stops it
    stopped_by_deadline: bool = False  # the deadline, not the timeout, sets expires_at
    loop: asyncio.AbstractEventLoop | None = None
    async_task: asyncio.Task | None = None
    interrupt_error: BaseException | None = None
    settle: bool = True  # False once the task is no longer this worker's to settle
    claimed_at: float = 0.0  # time.monotonic() when the claim that leased it was sent

    @property
    def id(self) -> str:
        return self.claimed.id


@dataclass(slots=True)
class Outcome:
    job: Job | None
    claimed: ClaimedTask
    result_json: str | None = None  # set on success
    failure: Failure | None = None
    finished_at: float = field(default_factory=time.time)


class Unrunnable(Exception):
    """A claimed task that cannot run; its cause says why."""

    def __init__(self, message: TaskMessage | None) -> None:
        super().__init__()
        self.message = message


def raise_in_thread(thread: threading.Thread | None, exc_type: type[BaseException]) -> None:
    """Raise `exc_type` in a thread at its next Python instruction (not inside a blocking C call)."""
    if thread is not None and thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))

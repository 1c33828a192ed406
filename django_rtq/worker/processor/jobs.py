"""The processor's job table: the jobs it holds, under its one lock, and every change of their state."""

from __future__ import annotations

import asyncio
import ctypes
import enum
import logging
import queue as queue_module
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from ...broker import Broker, ClaimedTask, TaskMessage
from ...exceptions import TaskCancelled
from ...registry import TaskType
from ..outcome import Failure

logger = logging.getLogger(__name__)

#: Seconds a worker counts as busy after its last task in flight finished.
BUSY_GRACE = 0.5
#: Put on the work queue to hand the fetcher's role to the thread that takes it.
FETCH = object()


class JobState(enum.Enum):
    """Where a claimed task is inside the processor."""

    QUEUED = "queued"  # claimed, waiting for a free thread
    RUNNING = "running"
    CANCELLED = "cancelled"  # cancellation asked for before it started
    DONE = "done"  # handler returned; outcome waits to be settled
    ABANDONED = "abandoned"  # timed out, cancelled while running, or given back unstarted
    STOPPED = "stopped"  # its handler was stopped (shutdown, lost lease); nothing to settle


class HandlerStage(enum.Enum):
    """Where a running job's thread is: only INSIDE its handler may it be interrupted."""

    BEFORE = "before"
    INSIDE = "inside"
    AFTER = "after"  # the handler returned or raised: its outcome is being recorded


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
    stage: HandlerStage = HandlerStage.BEFORE
    #: Orders an interruption with the thread's moves in and out of the handler (`stage`).
    window: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def id(self) -> str:
        return self.claimed.id

    # An exception raised in a thread lands at its next Python instruction, wherever that is. In
    # the worker's own code it could land just after the thread took the job table's lock, and
    # leave the lock held by a thread that ends: the whole worker would hang. So a thread is
    # interrupted only while inside its handler, and one raised as the handler returns is
    # withdrawn before the thread takes any lock (or lands at once, before it takes one).

    def enter_handler(self) -> None:
        """Called by the job's thread just before the handler: raises the interruption that came first."""
        with self.window:
            if self.interrupt_error is not None:
                raise self.interrupt_error
            self.stage = HandlerStage.INSIDE

    def leave_handler(self) -> None:
        """Called by the job's thread as the handler returns or raises: no interruption lands after this."""
        with self.window:
            self.stage = HandlerStage.AFTER
            if self.interrupt_error is not None:  # else none was raised in this thread (interrupt_handler)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)

    def interrupt_handler(self, error: BaseException) -> bool:
        """Stop the (synchronous) handler with `error`: raised in its thread now, or as it would
        start. False if the handler already returned (its outcome stands)."""
        with self.window:
            if self.stage is HandlerStage.AFTER:
                return False
            self.interrupt_error = error
            if self.stage is HandlerStage.INSIDE:
                raise_in_thread(self.thread, type(error))
            return True


@dataclass(slots=True)
class Outcome:
    job: Job | None
    claimed: ClaimedTask
    result_json: str | None = None  # set on success
    failure: Failure | None = None
    finished_at: float = field(default_factory=time.time)

    @classmethod
    def failed(cls, job: Job, error: BaseException) -> Outcome:
        """The outcome of a job stopped or skipped with `error` (which its handler did not raise)."""
        failure = Failure(claimed=job.claimed, message=job.message, error=error, started_at=job.started_at)
        return cls(job=job, claimed=job.claimed, failure=failure)


class Unrunnable(Exception):
    """A claimed task that cannot run; its cause says why."""

    def __init__(self, message: TaskMessage | None) -> None:
        super().__init__()
        self.message = message


def raise_in_thread(thread: threading.Thread | None, exc_type: type[BaseException]) -> None:
    """Raise `exc_type` in a thread at its next Python instruction (not inside a blocking C call)."""
    if thread is not None and thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))


def ids_by_queue(jobs: list[Job]) -> dict[str, list[str]]:
    by_queue: dict[str, list[str]] = defaultdict(list)
    for job in jobs:
        by_queue[job.claimed.queue].append(job.id)
    return by_queue


def give_back(
    broker: Broker,
    worker_id: str,
    by_queue: dict[str, list[str]],
    why: str,
    *,
    quiet: bool = False,
    keep_on_error: bool = False,
) -> None:
    """Return tasks none of whose handlers runs to the front of pending, uncounted, queue by
    queue, removing each queue from `by_queue` once its tasks are back.

    A failure is logged (the recoverer takes the tasks back once their lease expires), or, with
    `keep_on_error`, raised: the queues left in `by_queue` are then for the caller to keep.
    `quiet` logs a failure only, naming the tasks: for tasks handed back as they come.
    """
    for queue in list(by_queue):
        task_ids = by_queue[queue]
        try:
            count = broker.requeue(queue, task_ids, worker_id=worker_id)
        except Exception as exc:
            if keep_on_error:
                raise
            if quiet:
                ids = ", ".join(map(repr, task_ids))
                logger.warning("could not give back task(s) %s (%s): %s", ids, why, exc)
            else:
                logger.warning(
                    "could not return %d task(s) of queue %r to pending (%s); the recoverer "
                    "will once their lease expires",
                    len(task_ids),
                    queue,
                    exc,
                )
            continue
        del by_queue[queue]
        if not quiet:
            logger.info("returned %d task(s) %s to pending in queue %r", count, why, queue)


class JobTable:
    """The job table holds the tasks a worker claimed until their outcome is settled, and is the
    one place that changes a job's state, under the processor's one lock, `cond`.

    Methods whose names end in `_locked` expect the caller to hold `cond`; the others take it.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        #: The queue's clock (the broker's): an attempt's start is noted on it, as its end is.
        self.clock = clock
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        #: Jobs whose handlers ended at a checkpoint as the worker stopped, to give back.
        self.stopped_at_checkpoint: list[Job] = []
        #: Jobs for the threads to run, FETCH to pass the fetching on, None to end a thread.
        self.work: queue_module.SimpleQueue[Job | object | None] = queue_module.SimpleQueue()
        #: Outcomes for the settler; None ends it.
        self.outcomes: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self.in_flight = 0  # claimed, not yet finished
        self.queued = 0  # of those, how many wait for a thread
        self.idle_since = -BUSY_GRACE  # when the last task in flight finished (monotonic)
        self.owned: dict[str, Job | ClaimedTask] = {}  # claimed and not yet settled: leases to extend
        self.running: dict[str, Job] = {}
        # Jobs whose lease could not be renewed, that never started or whose handler stopped:
        # given back as soon as Redis answers, rather than when their lease runs out.
        self.lost: list[Job] = []
        #: Whether the fetcher would claim now (the processor sets it): a freed slot wakes it only then.
        self.room_wanted: Callable[[], bool] = lambda: True

    # What the others read

    @property
    def busy(self) -> bool:
        """Whether tasks are running or waiting for a thread, or were a moment ago: a worker
        draining a queue has none in flight for an instant between two claims."""
        return self.in_flight > 0 or time.monotonic() - self.idle_since < BUSY_GRACE

    def jobs_locked(self) -> list[Job]:
        return [job for job in self.owned.values() if isinstance(job, Job)]

    def running_jobs(self) -> list[Job]:
        with self.cond:
            return list(self.running.values())

    def owned_by_queue(self) -> dict[str, list[tuple[str, bool]]]:
        """The tasks whose leases this worker holds, by queue, each with whether it has started."""
        with self.cond:
            grouped: dict[str, list[tuple[str, bool]]] = defaultdict(list)
            for task_id, job in self.owned.items():
                if isinstance(job, Job):
                    grouped[job.claimed.queue].append((task_id, job.started_at is not None))
                else:
                    grouped[job.queue].append((task_id, True))
            return dict(grouped)

    # Changes of state

    def take_in(self, jobs: list[Job], unrunnable: list[ClaimedTask]) -> None:
        """Own claimed tasks: jobs to run (QUEUED), and tasks that cannot run, to settle."""
        with self.cond:
            self.in_flight += len(jobs)
            self.queued += len(jobs)
            for job in jobs:
                self.owned[job.id] = job
            for claimed in unrunnable:
                self.owned[claimed.id] = claimed

    def cancel_queued_locked(self, job: Job) -> bool:
        """Mark a job that has not started CANCELLED (its executor skips it); False if it has."""
        if job.state is not JobState.QUEUED:
            return False
        job.state = JobState.CANCELLED
        return True

    def start_running(self, job: Job) -> bool:
        """Take a job off the work queue and mark it RUNNING on this thread; False if it is not
        to run (abandoned, or cancelled: then its failure goes to be settled)."""
        with self.cond:
            self.queued -= 1
            if self.queued == 0:
                self.cond.notify_all()  # the fetcher may claim more before the threads idle
            if job.state is JobState.ABANDONED:
                return False
            if job.state is JobState.CANCELLED:
                self.free_slot_locked(job)
                self.outcomes.put(Outcome.failed(job, TaskCancelled("cancelled before it started")))
                return False
            job.state = JobState.RUNNING
            job.thread = threading.current_thread()
            job.started_at = self.clock()
            self.running[job.id] = job
            return True

    def finish(self, job: Job, outcome: Outcome) -> JobState:
        """Record that a job's handler returned or raised; return the job's state now: DONE, its
        outcome to be settled; STOPPED, not this worker's to settle (shutdown, lost lease);
        ABANDONED, given up already (its thread replaced)."""
        with self.cond:
            if not job.settle:
                self._mark_stopped_locked(job)
                return JobState.STOPPED
            if job.state is JobState.ABANDONED:
                return JobState.ABANDONED
            job.state = JobState.DONE
            self.running.pop(job.id, None)
            self.free_slot_locked(job)
            self.outcomes.put(outcome)  # under the lock, so that stop() cannot miss it
            return JobState.DONE

    def _mark_stopped_locked(self, job: Job) -> None:
        job.state = JobState.STOPPED
        if not self.stopping.is_set():
            self.lost.append(job)  # its lease was lost; its handler has stopped
        if self.running.pop(job.id, None) is not None:
            self.free_slot_locked(job)
        self.cond.notify_all()

    def abandon_locked(self, jobs: list[Job]) -> list[Job]:
        """Forget jobs that will not run here (or no longer); return them."""
        for job in jobs:
            if job.state is JobState.QUEUED:
                self.free_slot_locked(job)  # the executor that takes it skips it
            job.state = JobState.ABANDONED
            self.owned.pop(job.id, None)
        return jobs

    def lose_locked(self, jobs: list[Job]) -> None:
        """Abandon jobs waiting for a thread whose lease may run out, to give back once Redis answers."""
        self.lost += self.abandon_locked(jobs)

    def abandon_queued(self) -> list[Job]:
        """Forget the jobs that have not started (at shutdown); return them, to give back."""
        with self.cond:
            return self.abandon_locked([job for job in self.jobs_locked() if job.state is JobState.QUEUED])

    def abandon_running_locked(self, job: Job) -> None:
        """Give up a running job whose handler is being interrupted: its thread is replaced."""
        job.state = JobState.ABANDONED
        self.running.pop(job.id, None)
        self.free_slot_locked(job)

    def disown_locked(self, job: Job) -> None:
        """The job's task is no longer this worker's (its lease was lost): settle nothing of it."""
        job.settle = False
        self.owned.pop(job.id, None)

    def stop_settling_locked(self, job: Job) -> None:
        """Settle nothing of a running job whose handler the shutdown stops, and free its slot;
        it stays owned (its lease extended) until its handler has stopped."""
        job.settle = False
        self.running.pop(job.id, None)
        self.free_slot_locked(job)

    def stop_at_checkpoint(self, job: Job) -> None:
        """A handler ended at a checkpoint because the worker is stopping: settle nothing of it;
        the shutdown gives its task back (see Watchdog.stop_handlers)."""
        with self.cond:
            if self.stopping.is_set() and job.settle and job.state is JobState.RUNNING:
                job.settle = False
                self.stopped_at_checkpoint.append(job)

    def let_go_locked(self, jobs: list[Job]) -> None:
        """Stop holding (and extending the leases of) jobs whose handlers the shutdown stopped."""
        for job in jobs:
            self.owned.pop(job.id, None)

    def settled(self, outcomes: list[Outcome]) -> None:
        """Let go of the tasks whose outcomes were settled (or failed to be)."""
        with self.cond:
            for outcome in outcomes:
                self.owned.pop(outcome.claimed.id, None)

    def take_lost(self) -> list[Job]:
        with self.cond:
            jobs, self.lost = self.lost, []
            return jobs

    def keep_lost(self, jobs: list[Job]) -> None:
        """Put back, first, lost jobs that could not be given back yet."""
        if jobs:
            with self.cond:
                self.lost[:0] = jobs

    def free_slot_locked(self, job: Job) -> None:
        """Free the job's slot."""
        self.in_flight -= 1
        if not self.in_flight:
            self.idle_since = time.monotonic()
        # Only what a waiter waits for: room for the fetcher to claim, or nothing left running
        # for stop(). Waking the fetcher at every task's end costs a thread switch each.
        if self.room_wanted() or not self.running:
            self.cond.notify_all()

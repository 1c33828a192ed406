"""The processor claims tasks from its queues in batches, runs them on threads, and settles them."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue as queue_module
import random
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import close_old_connections, connections

from .. import signals
from ..broker import Broker, ClaimedTask, TaskMessage
from ..broker.broker import Completion
from ..broker.limits import NO_LIMITS, FlowLimits
from ..broker.message import child_notice
from ..broker.timings import Timings
from ..context import TaskContext, set_current_task
from ..exceptions import (
    BrokerUnavailable,
    DeadlineExceeded,
    LeaseLost,
    NonRetryableError,
    TaskCancelled,
    TaskTimeout,
    WorkerShutdown,
)
from ..registry import find_task_type
from .job import Job, JobState, Outcome, Unrunnable, raise_in_thread
from .outcome import Failure, attempt_info, format_traceback, send_robust, settle_failure
from .subscriber import POLL_SECONDS, Subscriber
from .syncer import Syncer, SyncRequest

logger = logging.getLogger(__name__)
_RESULT_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

#: Outcomes settled in one round trip at most.
SETTLE_BATCH = 1000
#: Seconds a worker counts as busy after its last task in flight finished.
BUSY_GRACE = 0.5
#: Seconds between the watchdog's looks for tasks past their timeout or deadline.
WATCHDOG_INTERVAL = 0.05
#: Seconds an async task gets to honour a cancellation before its thread is abandoned.
ASYNC_CANCEL_GRACE = 2.0
#: Seconds a stopping fetcher listens for tasks handed over just before it left the idle lists.
HANDOFF_DRAIN_SECONDS = 0.05
#: Seconds to wait before claiming again after Redis was unreachable.
UNAVAILABLE_BACKOFF = 1.0
#: Longest wait (seconds) between claims while claiming keeps failing for another reason.
MAX_FAILURE_BACKOFF = 30.0
#: Seconds a full fetcher waits between looks at its hand-off channels (a task handed over
#: just as it filled up is given back at once, not left unread with its lease running out).
FULL_POLL_SECONDS = 0.05
#: Seconds running handlers get to stop once shutdown interrupts them.
SHUTDOWN_STOP_GRACE = 2.0
#: Handlers shorter than this (seconds, on average of late) make a worker hold more tasks:
#: SHORT_TASKS_BUFFER times its concurrency rather than twice (a task then waits in memory for
#: a few of these durations at most).
SHORT_TASK_SECONDS = 0.05
SHORT_TASKS_BUFFER = 4
#: Weight of the latest handler's duration in the moving average of durations.
RUN_SECONDS_WEIGHT = 0.2
#: Seconds between two additions of the worker's run and wait times to Redis (broker/timings.py).
TIMINGS_FLUSH_SECONDS = 1.0
#: Share of the lease kept in hand: a worker that could not renew its leases for the rest of
#: it stops its running tasks before the lease can expire and another worker run them.
LEASE_SAFETY = 0.2
#: Put on the work queue to hand the fetcher's role to the thread that takes it.
FETCH = object()


class Processor:
    """The processor claims batches of pending tasks (weighted or strict across its queues),
    runs them on `concurrency` threads, and settles their outcomes in batches.

    Idle, it waits on a pub/sub wake-up that the broker publishes when a queue's pending set
    goes from empty to non-empty, so a new task starts within a round trip or two, or for a
    task the broker hands to it at enqueue.

    Its `concurrency + 1` threads take turns as the fetcher: the one that is handed a task
    while the others idle runs it itself, and an idle thread takes over fetching. The task
    then starts without waking another thread first.
    """

    def __init__(
        self,
        *,
        broker: Broker,
        worker_id: str,
        queues: dict[str, int],
        concurrency: int,
        syncer: Syncer,
        strict: bool = False,
        idle_wait: float = 1.0,
        burst: bool = False,
    ) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.queues = dict(queues)
        self.concurrency = concurrency
        self.lease_seconds = broker.lease_ms / 1000
        self.syncer = syncer
        self.strict = strict
        self.idle_wait = idle_wait
        self.burst = burst
        self.started_at = time.time()
        #: Set when a burst worker found its queues drained.
        self.drained = threading.Event()

        self._cond = threading.Condition()
        # How long handlers took of late (seconds, a moving average): sets the capacity.
        self._recent_run_seconds = 0.0
        self._in_flight = 0
        #: Called after settling outcomes that wrote workflow commands (set by the server).
        self.on_commands: Callable[[], None] = lambda: None
        self._idle_since = -BUSY_GRACE  # when the last task in flight finished (monotonic)
        self._queued = 0  # of those, how many wait for a thread
        self._owned: dict[str, Job | ClaimedTask] = {}  # claimed and not yet settled: leases to extend
        self._running: dict[str, Job] = {}
        self._work: queue_module.SimpleQueue[Job | object | None] = queue_module.SimpleQueue()
        self._outcomes: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self._timings = Timings()  # the settler's alone
        self._timings_flushed_at = time.monotonic()
        self._stopping = threading.Event()
        self._fetch_stopped = threading.Event()
        # The thread fetching now (None while the role passes from one thread to another).
        self._fetching: threading.Thread | None = None
        # While the fetcher listens with nothing to do, a task handed to it is kept here for
        # the fetcher's own thread to run.
        self._idle_listening = False
        # seconds until a rate limit lets a waiting task start, from the last claim (None: no such task)
        self._limit_wait: float | None = None
        # the last claim left tasks that only wait for a free thread (limited ones: never prefetched)
        self._thread_bound = False
        # the flow-control limits the last claim applied
        self._claimed_under: FlowLimits = NO_LIMITS
        self._kept: Job | None = None
        # How long (seconds) a lease is relied on after the request that set it was sent, and
        # when (monotonic) the heartbeater's last successful renewal was sent.
        self._lease_budget = self.lease_seconds * (1 - LEASE_SAFETY)
        self._renewed_at = time.monotonic()
        self._threads: list[threading.Thread] = []
        # Jobs whose lease could not be renewed, that never started or whose handler stopped:
        # given back as soon as Redis answers, rather than when their lease runs out.
        self._lost: list[Job] = []
        # queue -> (time.monotonic() before which it is not claimed from, failures in a row)
        self._broken_queues: dict[str, tuple[float, int]] = {}
        # The fetcher listens, while idle, for wake-ups and for tasks handed to it at enqueue.
        self._handoff_queues = {broker.queue(name).handoff_channel(worker_id): name for name in self.queues}
        self._waker = Subscriber(
            broker=broker,
            channels=[broker.queue(name).wake_channel for name in self.queues] + list(self._handoff_queues),
            on_message=self._on_message,
            name="wake-up",
        )

    # Lifecycle

    def start(self) -> None:
        self._waker.listen(0)  # subscribe before the first claim, so no wake-up is missed
        for _ in range(self.concurrency + 1):  # one of them fetches at any time
            self._start_executor()
        self._settler = self._start_thread(self._settle_loop, "rtq-settle")
        self._watchdog = self._start_thread(self._watch_loop, "rtq-watchdog")
        self._work.put(FETCH)

    def stop(self, timeout: float) -> None:
        """Stop claiming, give back the tasks that have not started, let running tasks finish
        for up to `timeout` seconds, then stop those still running and give them back too.

        A task is given back only once its handler has stopped, so no other worker can run
        it while it still runs here. A handler that ignores the interruption (stuck in C code)
        keeps its task: the lease runs out after this process exits, and the recoverer gives
        the task to another worker then.
        """
        self._stopping.set()
        while not self._fetch_stopped.wait(0.1):
            fetching = self._fetching
            if fetching is not None and not fetching.is_alive():
                break  # it died (dead_threads() tells); there is nothing to wait for
        with self._cond:
            waiting = self._abandon_locked([job for job in self._jobs() if job.state is JobState.QUEUED])
        self._give_back(waiting, "that had not started")
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._running and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            stopping = list(self._running.values())
            for job in stopping:
                job.settle = False
                self._running.pop(job.id, None)
                self._finish_locked(job)
                self._signal_stop(job, WorkerShutdown("the worker shut down before the task finished"))
            stop_deadline = time.monotonic() + SHUTDOWN_STOP_GRACE
            while (
                any(job.state is not JobState.STOPPED for job in stopping)
                and time.monotonic() < stop_deadline
            ):
                self._cond.wait(0.05)
            stopped = [job for job in stopping if job.state is JobState.STOPPED]
            stuck = [job for job in stopping if job.state is not JobState.STOPPED]
            for job in stopping:
                self._owned.pop(job.id, None)
        self._give_back(stopped, "stopped by the shutdown")
        for job in stuck:
            logger.error(
                "task %r (%s) of queue %r did not stop; its lease will run out once this worker "
                "exits, and another worker will run it then",
                job.id,
                job.message.task,
                job.claimed.queue,
            )
        for _ in range(len(self._threads)):
            self._work.put(None)
        self._outcomes.put(None)
        self._settler.join()
        self._watchdog.join()

    def _jobs(self) -> list[Job]:
        return [job for job in self._owned.values() if isinstance(job, Job)]

    def _abandon_locked(self, jobs: list[Job]) -> list[Job]:
        """Forget jobs that will not run here (the caller holds the lock); return them."""
        for job in jobs:
            if job.state is JobState.QUEUED:
                self._finish_locked(job)  # the executor that takes it skips it
            job.state = JobState.ABANDONED
            self._owned.pop(job.id, None)
        return jobs

    def _give_back(self, jobs: list[Job], why: str) -> None:
        """Return tasks to the front of pending, uncounted (none of their handlers runs)."""
        by_queue: dict[str, list[str]] = defaultdict(list)
        for job in jobs:
            by_queue[job.claimed.queue].append(job.id)
        for queue, task_ids in by_queue.items():
            try:
                count = self.broker.requeue(queue, task_ids, worker_id=self.worker_id)
                logger.info("returned %d task(s) %s to pending in queue %r", count, why, queue)
            except Exception as exc:
                logger.warning(
                    "could not return %d task(s) of queue %r to pending (%s); the recoverer "
                    "will once their lease expires",
                    len(task_ids),
                    queue,
                    exc,
                )

    def _give_back_lost(self) -> None:
        """Give back the tasks of lost leases (raises BrokerUnavailable, keeping them, while
        Redis is away). A task another worker has taken since is not this worker's: skipped."""
        with self._cond:
            jobs, self._lost = self._lost, []
        by_queue: dict[str, list[str]] = defaultdict(list)
        for job in jobs:
            by_queue[job.claimed.queue].append(job.id)
        try:
            for queue, task_ids in by_queue.items():
                count = self.broker.requeue(queue, task_ids, worker_id=self.worker_id)
                logger.info("returned %d task(s) whose lease was lost to pending in queue %r", count, queue)
                jobs = [job for job in jobs if job.claimed.queue != queue]
        finally:
            if jobs:
                with self._cond:
                    self._lost[:0] = jobs

    def _start_thread(self, target: Any, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def _start_executor(self) -> None:
        self._threads.append(self._start_thread(self._executor_loop, f"rtq-exec-{len(self._threads)}"))

    @property
    def capacity(self) -> int:
        """How many claimed tasks not yet finished the worker may hold: those beyond its
        threads wait in memory, so claims come in batches. Short tasks get a deeper buffer (a
        claim's round trip then costs more than the work it brings); long ones a shallow one,
        since a task waiting in one worker's memory is not run by another that is idle."""
        if self._recent_run_seconds < SHORT_TASK_SECONDS:
            return SHORT_TASKS_BUFFER * self.concurrency
        return 2 * self.concurrency

    # What the heartbeater and the subscriber ask of the processor

    @property
    def busy(self) -> bool:
        """Whether tasks are running or waiting for a thread, or were a moment ago: a worker
        draining a queue has none in flight for an instant between two claims."""
        return self._in_flight > 0 or time.monotonic() - self._idle_since < BUSY_GRACE

    def owned_by_queue(self) -> dict[str, list[tuple[str, bool]]]:
        """The tasks whose leases this worker holds, by queue, each with whether it has started."""
        with self._cond:
            grouped: dict[str, list[tuple[str, bool]]] = defaultdict(list)
            for task_id, job in self._owned.items():
                if isinstance(job, Job):
                    grouped[job.claimed.queue].append((task_id, job.started_at is not None))
                else:
                    grouped[job.queue].append((task_id, True))
            return dict(grouped)

    def lease_extended(self, sent_at: float) -> None:
        """Note that the leases were renewed by a request sent at `sent_at` (time.monotonic())."""
        self._renewed_at = max(self._renewed_at, sent_at)

    def dead_threads(self) -> list[str]:
        """Names of the processor's own threads that died although it is not stopping."""
        if self._stopping.is_set():
            return []
        dead = [thread.name for thread in (self._settler, self._watchdog) if not thread.is_alive()]
        fetching = self._fetching
        if fetching is not None and not fetching.is_alive():
            dead.append(f"{fetching.name} (fetching)")
        return dead

    def describe(self) -> dict[str, Any]:
        with self._cond:
            running = [
                {
                    "id": job.id,
                    "task": job.message.task,
                    "queue": job.claimed.queue,
                    "started_at": job.started_at,
                }
                for job in self._running.values()
            ]
        return {
            "id": self.worker_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "strict": self.strict,
            "concurrency": self.concurrency,
            "started_at": self.started_at,
            "active": running,
        }

    def cancel(self, task_id: str) -> bool:
        """Stop a task this worker holds: skip it if it has not started, interrupt it if it runs."""
        with self._cond:
            job = self._owned.get(task_id)
            if not isinstance(job, Job):
                return False
            logger.info("cancelling task %r (%s) of queue %r", job.id, job.message.task, job.claimed.queue)
            if job.state is JobState.QUEUED:
                job.state = JobState.CANCELLED
                return True
        return self._interrupt(job, TaskCancelled("cancelled on request"))

    # Claiming

    def _fetch_loop(self) -> Job | None:
        """Claim and dispatch tasks until stopping (then return None), or until handed a task
        while idle: then pass the role on to an idle thread and return the task, to run it."""
        self._fetching = threading.current_thread()
        failures = 0
        while not self._stopping.is_set():
            self._wait_for_room()
            if self._stopping.is_set():
                break
            with self._cond:
                free = self.capacity - self._in_flight
                start_now = max(0, self.concurrency - self._in_flight)
            while self._waker.listen(0) is not None:
                pass  # wake-ups that came while we were busy: we are about to claim anyway
            try:
                if self._lost:
                    self._give_back_lost()
                claimed_at = time.monotonic()
                claimed = self._claim(free, start_now)
                failures = 0
                if claimed:
                    self._dispatch(claimed, claimed_at, self._claimed_under)
                if len(claimed) == free or (claimed and self.burst) or self._thread_bound:
                    continue  # the queues may hold more (for a free thread, if thread bound)
                if self.burst and not claimed and self._is_drained():
                    self.drained.set()
                    break
            except BrokerUnavailable as exc:
                logger.debug("cannot claim tasks: %s", exc)  # the healthchecker tells
                self._stopping.wait(UNAVAILABLE_BACKOFF)
                continue
            except Exception:
                failures += 1
                backoff = min(MAX_FAILURE_BACKOFF, UNAVAILABLE_BACKOFF * 2 ** min(failures, 5))
                logger.exception("claiming tasks failed; trying again in %.0fs", backoff)
                self._stopping.wait(backoff)
                continue
            kept = self._wait_for_work()
            if kept is not None:
                self._fetching = None
                self._work.put(FETCH)  # a thread is idle: it was handed this task for one
                return kept
        self._leave_idle()
        self._fetch_stopped.set()
        return None

    def _wait_for_room(self) -> None:
        """Wait until there is room to claim, reading the hand-off channels meanwhile."""
        while not self._stopping.is_set():
            with self._cond:
                if self._should_claim():
                    return
                self._cond.wait(FULL_POLL_SECONDS)
                if self._should_claim():
                    return
            while self._waker.listen(0) is not None:
                pass

    def _leave_idle(self) -> None:
        """Stop being handed tasks; take in those handed over meanwhile (stop() gives them back)."""
        try:
            self.broker.leave_idle(self.queues, worker_id=self.worker_id)
            while self._waker.listen(HANDOFF_DRAIN_SECONDS) is not None:
                pass
        except BrokerUnavailable as exc:
            logger.warning("could not leave the idle lists (%s); their entries expire by themselves", exc)
        self._waker.close()

    def _on_message(self, channel: str, data: str) -> None:
        queue = self._handoff_queues.get(channel)
        if queue is None:
            return
        # A task handed to this worker, already under its lease: "<id>\n<run>\n<message JSON>".
        task_id, _, rest = data.partition("\n")
        run, _, raw_message = rest.partition("\n")
        claimed = ClaimedTask(id=task_id, queue=queue, raw_message=raw_message or None, run=run)
        limits = self.broker.limits()
        if self._limited(limits, queue, raw_message):
            self._hand_back(queue, [task_id], "a limit may hold it back: it goes through a claim")
            return
        with self._cond:
            has_room = self._in_flight < self.concurrency and not self._stopping.is_set()
            # With no task waiting for a thread, a thread idles, to which the fetching passes.
            keep = has_room and self._idle_listening and self._kept is None and self._queued == 0
        if has_room:
            # Its lease was set at enqueue, a moment before the message arrived: count from earlier.
            claimed_at = time.monotonic() - self._lease_budget / 4
            if keep:
                jobs = self._take_in([claimed], claimed_at, limits)
                self._kept = jobs[0] if jobs else None
            else:
                self._dispatch([claimed], claimed_at, limits)
            return
        self._hand_back(queue, [task_id], "it came as this worker filled up: another worker will run it")

    def _hand_back(self, queue: str, task_ids: list[str], why: str) -> None:
        """Give back tasks that never started (their leases expire if Redis does not answer)."""
        try:
            self.broker.requeue(queue, task_ids, worker_id=self.worker_id)
        except Exception as exc:
            ids = ", ".join(map(repr, task_ids))
            logger.warning("could not give back task(s) %s (%s): %s", ids, why, exc)

    def _limited(self, limits: FlowLimits, queue: str, raw_message: str) -> bool:
        """Is a task handed over one that this worker's limits may hold back? The enqueuer hands
        none such over, unless its deploy's limits differ."""
        if not limits:
            return False
        try:
            task = json.loads(raw_message).get("task", "")
        except (ValueError, AttributeError):
            return False  # a corrupt task: archived as usual
        return limits.holds(queue, task)

    def _wait_for_work(self) -> Job | None:
        """Wait until a queue gets work (the broker publishes when a queue's pending set goes
        from empty to non-empty), at most `idle_wait` seconds, or until stopped. Return the
        task handed to this worker meanwhile if it is for this thread to run."""
        wait = self.idle_wait if self._limit_wait is None else min(self.idle_wait, self._limit_wait)
        deadline = time.monotonic() + wait
        self._idle_listening = True
        try:
            while not self._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._waker.listen(min(remaining, POLL_SECONDS)) is not None:
                    break
        finally:
            self._idle_listening = False
        kept, self._kept = self._kept, None
        return kept

    def _should_claim(self) -> bool:
        """Claim when half the capacity is free, or at once when a thread would otherwise idle;
        after a claim that left tasks waiting only for a free thread, as soon as one frees."""
        if self._thread_bound:
            return self._in_flight < self.concurrency
        free = self.capacity - self._in_flight
        return free >= self.concurrency or (free > 0 and self._queued == 0)

    def queue_order(self) -> list[str]:
        """Strict: by weight, highest first. Weighted: a random order, heavier queues likelier first."""
        if self.strict:
            return sorted(self.queues, key=lambda name: -self.queues[name])
        names, weights = list(self.queues), list(self.queues.values())
        order = []
        while names:
            i = random.choices(range(len(names)), weights)[0]
            order.append(names.pop(i))
            weights.pop(i)
        return order

    def _claim(self, limit: int, start_now: int) -> list[ClaimedTask]:
        """Claim up to `limit` tasks across the queues; the first `start_now` start at once.

        A short claim registers the worker as idle in that queue; if a later queue then fills
        the batch, the worker leaves those idle lists again, so that nothing is handed to it
        while it has no room.
        """
        claimed: list[ClaimedTask] = []
        self._limit_wait = None
        self._thread_bound = False
        # Long enough to outlast the idle wait before the next claim renews it; only a worker
        # with a free thread is handed tasks, which start at once.
        idle_for_ms = int((2 * self.idle_wait + 1) * 1000) if self.broker.hands_off and start_now else 0
        registered = []
        for queue in self.queue_order() if len(self.queues) > 1 else self.queues:
            if self._broken_queues.get(queue, (0.0, 0))[0] > time.monotonic():
                continue
            wanted = limit - len(claimed)
            try:
                got = self.broker.claim(
                    queue,
                    worker_id=self.worker_id,
                    limit=wanted,
                    start_now=max(0, start_now - len(claimed)),
                    idle_for_ms=idle_for_ms,
                )
            except BrokerUnavailable:
                raise
            except Exception:
                self._queue_failed(queue)
                continue
            self._broken_queues.pop(queue, None)
            self._claimed_under = got.limits
            self._thread_bound = self._thread_bound or got.thread_bound
            if got.wait is not None:
                self._limit_wait = got.wait if self._limit_wait is None else min(self._limit_wait, got.wait)
            if idle_for_ms and len(got) < wanted:
                registered.append(queue)
            claimed += got
            if len(claimed) >= limit:
                break
        if registered and len(claimed) >= limit:
            self.broker.leave_idle(registered, worker_id=self.worker_id)
        return claimed

    def _queue_failed(self, queue: str) -> None:
        """A claim from one queue failed for another reason than Redis being away (its keys
        hold data of the wrong type, say): leave that queue alone for a while, backing off,
        and go on serving the others."""
        failures = self._broken_queues.get(queue, (0.0, 0))[1] + 1
        backoff = min(MAX_FAILURE_BACKOFF, UNAVAILABLE_BACKOFF * 2 ** min(failures, 5))
        self._broken_queues[queue] = (time.monotonic() + backoff, failures)
        logger.exception("claiming from queue %r failed; trying it again in %.0fs", queue, backoff)

    def _dispatch(self, batch: list[ClaimedTask], claimed_at: float, limits: FlowLimits) -> None:
        """Take in claimed tasks whose leases were set by a request sent at `claimed_at`
        (monotonic), for the threads to run."""
        for job in self._take_in(batch, claimed_at, limits):
            self._work.put(job)

    def _take_in(self, batch: list[ClaimedTask], claimed_at: float, limits: FlowLimits) -> list[Job]:
        """Own claimed tasks as jobs (those that cannot run go to be archived); return the jobs.

        `limits` are those the claim applied: a task of a type with limits they did not know (its
        module was first imported just now, to run it) is given back, for a claim to apply them."""
        jobs, failures, unlimited = [], [], []
        for claimed in batch:
            try:
                job = self._job(claimed)
                job.claimed_at = claimed_at
                if job.task_type.name not in limits.types and job.task_type.limit is not None:
                    unlimited.append(job)
                    continue
                jobs.append(job)
            except Exception as exc:
                message = exc.message if isinstance(exc, Unrunnable) else None
                failures.append(
                    Outcome(
                        job=None,
                        claimed=claimed,
                        failure=Failure(claimed=claimed, message=message, error=exc.__cause__ or exc),
                    )
                )
        with self._cond:
            self._in_flight += len(jobs)
            self._queued += len(jobs)
            for job in jobs:
                self._owned[job.id] = job
            for outcome in failures:
                self._owned[outcome.claimed.id] = outcome.claimed
        for outcome in failures:
            logger.error(
                "archiving task %r of queue %r: %s",
                outcome.claimed.id,
                outcome.claimed.queue,
                outcome.failure.error,
            )
            self._outcomes.put(outcome)
        if unlimited:
            by_queue: dict[str, list[str]] = defaultdict(list)
            for job in unlimited:
                by_queue[job.claimed.queue].append(job.id)
            for queue, task_ids in by_queue.items():
                logger.info(
                    "giving back %d task(s) of queue %r claimed before their type's limits were known",
                    len(task_ids),
                    queue,
                )
                self._hand_back(queue, task_ids, "claimed before their type's limits were known")
        return jobs

    def _job(self, claimed: ClaimedTask) -> Job:
        """Make a job of a claimed task, or raise Unrunnable saying why it cannot run."""
        if claimed.raw_message is None:
            raise Unrunnable(None) from NonRetryableError("the task's message is missing")
        try:
            message = TaskMessage.from_json(claimed.raw_message, id=claimed.id, queue=claimed.queue)
        except ValueError as exc:
            raise Unrunnable(None) from NonRetryableError(f"the task's payload is corrupt: {exc}")
        task_type = find_task_type(message.task)
        if task_type is None:
            raise Unrunnable(message) from NonRetryableError(f"unknown task type {message.task!r}")
        if message.deadline is not None and message.deadline <= time.time():
            raise Unrunnable(message) from DeadlineExceeded("the task's deadline passed before it started")
        return Job(claimed=claimed, message=message, task_type=task_type)

    def _is_drained(self) -> bool:
        with self._cond:
            if self._owned:
                return False
        for queue in self.queues:
            self.broker.forward(queue)
        return self.broker.is_drained(self.queues)

    # Running

    def _executor_loop(self) -> None:
        loop: asyncio.AbstractEventLoop | None = None
        try:
            while True:
                job = self._work.get()
                if job is FETCH:
                    job = self._fetch_loop()  # a task handed over while idle, or None once stopping
                    if job is None:
                        return  # taking work now could start a task that stop() gives back
                if not isinstance(job, Job):
                    return  # stop() ends the threads
                if job.task_type.is_async and loop is None:
                    loop = asyncio.new_event_loop()
                if not self._run(job, loop if job.task_type.is_async else None):
                    return  # this thread was abandoned (a fresh one took its place) or stopped
        except BaseException:
            # An interruption meant for an abandoned job may land after its handler returned.
            if threading.current_thread() in self._threads:
                logger.exception("executor thread failed")
        finally:
            if loop is not None:
                loop.close()
            connections.close_all()  # this thread's own; left open they outlive the worker

    def _run(self, job: Job, loop: asyncio.AbstractEventLoop | None) -> bool:
        """Run one job; return False if this thread was abandoned or stopped and must end."""
        with self._cond:
            self._queued -= 1
            if self._queued == 0:
                self._cond.notify_all()  # the fetcher may claim more before the threads idle
            if job.state is JobState.ABANDONED:
                return True
            if job.state is JobState.CANCELLED:
                self._finish_locked(job)
                self._outcomes.put(self._failed(job, TaskCancelled("cancelled before it started")))
                return True
            job.state = JobState.RUNNING
            job.thread = threading.current_thread()
            job.started_at = time.time()
            self._running[job.id] = job
        outcome = Outcome(job=job, claimed=job.claimed)
        try:
            self._set_expiry(job)
            set_current_task(self._context(job))
            if loop is not None:
                job.loop = loop
                job.async_task = loop.create_task(self._call_async(job))
            close_old_connections()
            send_robust(signals.task_started, job.task_type, message=job.message, worker_id=self.worker_id)
            if loop is not None:
                result = self._await(job, loop)
            else:
                result = job.task_type.func(*job.message.args, **job.message.kwargs)
            try:
                outcome.result_json = _RESULT_ENCODER.encode(result)
            except (TypeError, ValueError) as exc:
                raise NonRetryableError(f"the task's return value is not JSON-serializable: {exc}") from exc
            send_robust(signals.task_succeeded, job.task_type, message=job.message, result=result)
        except BaseException as exc:
            outcome.failure = Failure(
                claimed=job.claimed,
                message=job.message,
                error=exc,
                traceback=format_traceback(exc),
                started_at=job.started_at,
            )
        finally:
            close_old_connections()
        outcome.finished_at = time.time()
        # Unlocked: a lost update of a moving average is harmless.
        self._recent_run_seconds += (outcome.finished_at - job.started_at - self._recent_run_seconds) * (
            RUN_SECONDS_WEIGHT
        )
        with self._cond:
            if not job.settle:  # stopped by the shutdown, or its lease was lost: not ours to settle
                job.state = JobState.STOPPED
                if not self._stopping.is_set():
                    self._lost.append(job)  # its lease was lost; its handler has stopped
                if self._running.pop(job.id, None) is not None:
                    self._finish_locked(job)
                self._cond.notify_all()
                return threading.current_thread() in self._threads
            if job.state is JobState.ABANDONED:
                return False
            job.state = JobState.DONE
            self._running.pop(job.id, None)
            self._finish_locked(job)
            self._outcomes.put(outcome)  # under the lock, so that stop() cannot miss it
        return True

    def _context(self, job: Job) -> TaskContext:
        return TaskContext(
            id=job.id,
            task=job.message.task,
            queue=job.claimed.queue,
            retried=int(job.claimed.info.get("retried", 0)),
            max_retries=job.message.max_retries,
            worker_id=self.worker_id,
            enqueued_at=job.message.enqueued_at,
            started_at=job.started_at,
            deadline=job.message.deadline,
            info=job.claimed.info,
        )

    def _failed(self, job: Job, error: BaseException) -> Outcome:
        failure = Failure(claimed=job.claimed, message=job.message, error=error, started_at=job.started_at)
        return Outcome(job=job, claimed=job.claimed, failure=failure)

    def _set_expiry(self, job: Job) -> None:
        """Note when the watchdog must stop the job: at its timeout, or its deadline if sooner."""
        message = job.message
        seconds = message.timeout
        job.stopped_by_deadline = False
        if message.deadline is not None:
            until_deadline = message.deadline - time.time()
            if seconds is None or until_deadline < seconds:
                seconds, job.stopped_by_deadline = until_deadline, True
        if seconds is not None:
            job.expires_at = time.monotonic() + max(0.0, seconds)

    def _expiry_error(self, job: Job) -> BaseException:
        if job.stopped_by_deadline:
            return DeadlineExceeded("the task's deadline passed")
        return TaskTimeout(f"the task ran longer than its timeout of {job.message.timeout}s")

    async def _call_async(self, job: Job) -> Any:
        return await job.task_type.func(*job.message.args, **job.message.kwargs)

    def _await(self, job: Job, loop: asyncio.AbstractEventLoop) -> Any:
        try:
            return loop.run_until_complete(job.async_task)
        except asyncio.CancelledError:
            raise job.interrupt_error or TaskCancelled("cancelled") from None

    def _finish_locked(self, job: Job) -> None:
        """Free the job's slot (the caller holds the lock)."""
        self._in_flight -= 1
        if not self._in_flight:
            self._idle_since = time.monotonic()
        # Only what a waiter waits for: room for the fetcher to claim, or nothing left running
        # for stop(). Waking the fetcher at every task's end costs a thread switch each.
        if self._should_claim() or not self._running:
            self._cond.notify_all()

    # Timeouts, deadlines, cancellation and lost leases

    def _watch_loop(self) -> None:
        while not self._stopping.wait(WATCHDOG_INTERVAL):
            try:
                now = time.monotonic()
                if now - self._renewed_at > self._lease_budget:
                    self._lose_leases(now)
                with self._cond:
                    overdue = [
                        job
                        for job in self._running.values()
                        if job.expires_at is not None and job.expires_at <= now
                    ]
                for job in overdue:
                    self._interrupt(job, self._expiry_error(job))
            except Exception:
                logger.exception("the watchdog's pass failed")

    def _lose_leases(self, now: float) -> None:
        """The leases could not be renewed for almost a lease: stop every task whose lease may
        run out (neither renewed nor claimed since) before another worker may take it, and
        settle none of them (the recoverer gives them back)."""
        with self._cond:
            jobs = [
                job
                for job in self._jobs()
                if job.state in (JobState.QUEUED, JobState.RUNNING)
                and now - max(job.claimed_at, self._renewed_at) > self._lease_budget
            ]
            if not jobs:
                return
            running = [job for job in jobs if job.state is JobState.RUNNING]
            self._lost += self._abandon_locked([job for job in jobs if job.state is JobState.QUEUED])
        for job in running:
            self._interrupt(job, LeaseLost("the worker could not renew its lease"), settle=False)
        logger.error(
            "could not renew leases for %.1fs: stopped %d running task(s) and dropped %d waiting "
            "one(s); they go back to pending once Redis answers, or their lease expires",
            self.lease_seconds * (1 - LEASE_SAFETY),
            len(running),
            len(jobs) - len(running),
        )

    def _interrupt(self, job: Job, error: BaseException, *, settle: bool = True) -> bool:
        """Stop a running job and free its slot, whatever its thread is doing: fail it now,
        or with `settle=False` forget it (its task is no longer this worker's)."""
        with self._cond:
            if job.state is not JobState.RUNNING:
                return False
            if not settle:
                job.settle = False
                self._owned.pop(job.id, None)
            if job.async_task is not None and job.interrupt_error is None:
                # An async task is cancelled inside its loop; if it ignores that, it is abandoned.
                job.interrupt_error = error
                job.expires_at = time.monotonic() + ASYNC_CANCEL_GRACE
                job.loop.call_soon_threadsafe(job.async_task.cancel)
                return True
            job.state = JobState.ABANDONED
            self._running.pop(job.id, None)
            self._finish_locked(job)
            self._threads.remove(job.thread)
            self._start_executor()
            # Raised while we hold the lock: the thread cannot have ended and its id be reused.
            raise_in_thread(job.thread, type(error))
            if settle:
                self._outcomes.put(self._failed(job, error))
        logger.warning(
            "stopped task %r (%s) of queue %r: %s",
            job.id,
            job.message.task,
            job.claimed.queue,
            error,
        )
        return True

    def _signal_stop(self, job: Job, error: BaseException) -> None:
        """Interrupt a job's handler at shutdown (the caller holds the lock): its thread ends
        with it, marking it STOPPED."""
        if job.async_task is not None:
            job.interrupt_error = error
            job.loop.call_soon_threadsafe(job.async_task.cancel)
        else:
            raise_in_thread(job.thread, type(error))

    # Settling

    def _settle_loop(self) -> None:
        while True:
            try:  # with counts to add, no longer than until they are due
                first = self._outcomes.get(timeout=TIMINGS_FLUSH_SECONDS if self._timings else None)
            except queue_module.Empty:
                self._flush_timings()
                continue
            batch = [first] if first is not None else []
            last = first is None
            while not last and len(batch) < SETTLE_BATCH:
                try:
                    outcome = self._outcomes.get_nowait()
                except queue_module.Empty:
                    break
                if outcome is None:
                    last = True
                else:
                    batch.append(outcome)
            if batch:
                try:
                    self._settle(batch)
                except Exception:
                    logger.exception("settling %d outcome(s) failed", len(batch))
                finally:
                    with self._cond:
                        for outcome in batch:
                            self._owned.pop(outcome.claimed.id, None)
                self._observe(batch)
            if last or time.monotonic() - self._timings_flushed_at >= TIMINGS_FLUSH_SECONDS:
                self._flush_timings()
            if last:
                connections.close_all()  # signal receivers may have used the database
                return

    def _observe(self, batch: list[Outcome]) -> None:
        """Count how long each attempt ran and, for first attempts, waited to start."""
        for outcome in batch:
            job = outcome.job
            if job is None or job.started_at is None:
                continue  # it never ran
            message = job.message
            waited = None
            if not job.claimed.info:  # a first attempt: it waited from when it was due
                waited = job.started_at - max(message.enqueued_at or 0.0, message.process_at or 0.0)
            self._timings.observe(
                job.claimed.queue,
                message.task,
                ran=outcome.finished_at - job.started_at,
                ok=outcome.failure is None,
                waited=waited,
            )

    def _flush_timings(self) -> None:
        self._timings_flushed_at = time.monotonic()
        try:
            self._timings.flush(self.broker.add_timings)
        except Exception as exc:  # metrics: kept for the next flush, never in the way of tasks
            logger.debug("could not add run times to Redis yet: %s", exc)

    def _settle(self, batch: list[Outcome]) -> None:
        completions: dict[str, list[Completion]] = defaultdict(list)
        for outcome in batch:
            if outcome.failure is None:
                completions[outcome.claimed.queue].append(self._completion(outcome))
        for queue, done in completions.items():
            write = partial(self._complete, queue, done)
            self._write(write, f"completion of {len(done)} task(s) in queue {queue!r}")
        for outcome in batch:
            if outcome.failure is not None:
                write = partial(settle_failure, self.broker, outcome.failure, worker_id=self.worker_id)
                self._write(
                    write,
                    f"failure of task {outcome.claimed.id!r} in queue {outcome.claimed.queue!r}",
                )
        if any(outcome.job is not None and outcome.job.message.parent for outcome in batch):
            self.on_commands()

    def _complete(self, queue: str, done: list[Completion]) -> None:
        settled = self.broker.complete(queue, done, worker_id=self.worker_id)
        if settled < len(done):
            logger.warning(
                "%d of %d result(s) in queue %r came late (a newer run of the task had started, "
                "or it was gone) and were left out",
                len(done) - settled,
                len(done),
                queue,
            )

    def _completion(self, outcome: Outcome) -> Completion:
        job = outcome.job
        message = job.message
        info, times = {}, None
        if not message.retention and not self.broker.mirror:
            pass  # nothing of the attempt is kept
        elif job.claimed.info:
            info = attempt_info(job.claimed.info, self.worker_id, job.started_at)
            info["finished_at"] = outcome.finished_at
        else:  # a first attempt, the common case: the script writes its info (cheaper)
            times = (job.started_at, outcome.finished_at)
        return Completion(
            id=job.id,
            run=job.claimed.run,
            info=info,
            times=times,
            result_json=outcome.result_json,
            retention_ms=int(message.retention * 1000),
            unique_key=message.unique_key,
            notify=child_notice(message),
        )

    def _write(self, write: Any, description: str) -> None:
        """Make a write now, or have the syncer retry it while Redis cannot take it. Any other
        error leaves the task to the recoverer (its lease is no longer renewed)."""
        try:
            write()
        except BrokerUnavailable as exc:
            logger.warning("could not record the %s (%s); the syncer will retry", description, exc)
            self.syncer.add(SyncRequest(apply=write, description=description))
        except Exception:
            logger.exception(
                "could not record the %s; its task will be taken back once its lease expires", description
            )

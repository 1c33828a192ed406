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
from ..broker.message import child_notice
from ..context import TaskContext, set_current_task
from ..exceptions import (
    BrokerUnavailable,
    DeadlineExceeded,
    NonRetryableError,
    TaskCancelled,
    TaskTimeout,
)
from ..registry import find_task_type
from .job import Job, JobState, Outcome, Unrunnable, raise_in_thread
from .outcome import Failure, attempt_info, format_traceback, settle_failure
from .subscriber import POLL_SECONDS, Subscriber
from .syncer import Syncer, SyncRequest

logger = logging.getLogger(__name__)

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


class Processor:
    """The processor claims batches of pending tasks (weighted or strict across its queues),
    runs them on `concurrency` threads, and settles their outcomes in batches.

    Idle, it waits on a pub/sub wake-up that the broker publishes when a queue's pending set
    goes from empty to non-empty, so a new task starts within a round trip or two.
    """

    def __init__(
        self,
        *,
        broker: Broker,
        worker_id: str,
        queues: dict[str, int],
        concurrency: int,
        lease_seconds: float,
        syncer: Syncer,
        strict: bool = False,
        idle_wait: float = 1.0,
        burst: bool = False,
    ) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.queues = dict(queues)
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.syncer = syncer
        self.strict = strict
        self.idle_wait = idle_wait
        self.burst = burst
        self.started_at = time.time()
        #: Set when a burst worker found its queues drained.
        self.drained = threading.Event()

        self._cond = threading.Condition()
        # Tasks claimed and not yet finished running. Up to `capacity` may be held: a thread's
        # worth of tasks beyond `concurrency` waits in memory, so claims come in batches.
        self.capacity = 2 * concurrency
        self._in_flight = 0
        #: Called after settling outcomes that wrote workflow commands (set by the server).
        self.on_commands: Callable[[], None] = lambda: None
        self._idle_since = -BUSY_GRACE  # when the last task in flight finished (monotonic)
        self._queued = 0  # of those, how many wait for a thread
        self._owned: dict[str, Job | ClaimedTask] = {}  # claimed and not yet settled: leases to extend
        self._running: dict[str, Job] = {}
        self._work: queue_module.SimpleQueue[Job | None] = queue_module.SimpleQueue()
        self._outcomes: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self._stopping = threading.Event()
        self._lease_expiry = time.time() + lease_seconds
        self._threads: list[threading.Thread] = []
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
        for _ in range(self.concurrency):
            self._start_executor()
        self._settler = self._start_thread(self._settle_loop, "rtq-settle")
        self._watchdog = self._start_thread(self._watch_loop, "rtq-watchdog")
        self._fetcher = self._start_thread(self._fetch_loop, "rtq-fetch")

    def stop(self, timeout: float) -> None:
        """Stop claiming, let running tasks finish for up to `timeout` seconds, then give the
        unfinished ones back to pending."""
        self._stopping.set()
        self._fetcher.join()
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._in_flight and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            leftovers = [
                job
                for job in self._owned.values()
                if isinstance(job, Job)
                and job.state in (JobState.QUEUED, JobState.RUNNING, JobState.CANCELLED)
            ]
            for job in leftovers:
                job.state = JobState.ABANDONED
                self._running.pop(job.id, None)
        for _ in range(len(self._threads)):
            self._work.put(None)
        self._outcomes.put(None)
        self._settler.join()
        by_queue: dict[str, list[str]] = defaultdict(list)
        for job in leftovers:
            by_queue[job.claimed.queue].append(job.id)
        for queue, task_ids in by_queue.items():
            try:
                count = self.broker.requeue(queue, task_ids, worker_id=self.worker_id)
                logger.info("returned %d unfinished task(s) to pending in queue %r", count, queue)
            except BrokerUnavailable as exc:
                logger.warning(
                    "could not return %d task(s) of queue %r to pending (%s); the recoverer "
                    "will retry them once their lease expires",
                    len(task_ids),
                    queue,
                    exc,
                )
        with self._cond:
            self._owned.clear()
        self._watchdog.join()

    def _start_thread(self, target: Any, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def _start_executor(self) -> None:
        self._threads.append(self._start_thread(self._executor_loop, f"rtq-exec-{len(self._threads)}"))

    # What the heartbeater and the subscriber ask of the processor

    @property
    def busy(self) -> bool:
        """Whether tasks are running or waiting for a thread, or were a moment ago: a worker
        draining a queue has none in flight for an instant between two claims."""
        return self._in_flight > 0 or time.monotonic() - self._idle_since < BUSY_GRACE

    def owned_by_queue(self) -> dict[str, list[str]]:
        with self._cond:
            grouped: dict[str, list[str]] = defaultdict(list)
            for task_id, job in self._owned.items():
                claimed = job.claimed if isinstance(job, Job) else job
                grouped[claimed.queue].append(task_id)
            return dict(grouped)

    def lease_extended(self, expiry: float) -> None:
        self._lease_expiry = expiry

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

    def _fetch_loop(self) -> None:
        while not self._stopping.is_set():
            with self._cond:
                while not self._should_claim() and not self._stopping.is_set():
                    self._cond.wait(0.5)
                free = self.capacity - self._in_flight
            if self._stopping.is_set():
                break
            while self._waker.listen(0) is not None:
                pass  # wake-ups that came while we were busy: we are about to claim anyway
            try:
                claimed = self._claim(free)
                if claimed:
                    self._dispatch(claimed)
                if len(claimed) == free or (claimed and self.burst):
                    continue  # the queues may hold more
                if self.burst and not claimed and self._is_drained():
                    self.drained.set()
                    break
            except BrokerUnavailable as exc:
                logger.warning("cannot claim tasks: %s", exc)
                self._stopping.wait(UNAVAILABLE_BACKOFF)
                continue
            self._wait_for_work()
        self._leave_idle()

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
        if queue is not None:  # a task handed to this worker, already under its lease
            task_id, _, raw_message = data.partition("\n")
            self._dispatch([ClaimedTask(id=task_id, queue=queue, raw_message=raw_message or None)])

    def _wait_for_work(self) -> None:
        """Wait until a queue gets work (the broker publishes when a queue's pending set goes
        from empty to non-empty), at most `idle_wait` seconds, or until stopped."""
        deadline = time.monotonic() + self.idle_wait
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._waker.listen(min(remaining, POLL_SECONDS)) is not None:
                return

    def _should_claim(self) -> bool:
        """Claim when half the capacity is free, or at once when a thread would otherwise idle."""
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

    def _claim(self, limit: int) -> list[ClaimedTask]:
        claimed: list[ClaimedTask] = []
        now = time.time()
        lease_expiry_ms = int((now + self.lease_seconds) * 1000)
        # Long enough to outlast the idle wait before the next claim renews it.
        idle_until_ms = int((now + 2 * self.idle_wait + 1) * 1000) if self.broker.hands_off else 0
        for queue in self.queue_order() if len(self.queues) > 1 else self.queues:
            claimed += self.broker.claim(
                queue,
                worker_id=self.worker_id,
                lease_expiry_ms=lease_expiry_ms,
                limit=limit - len(claimed),
                idle_until_ms=idle_until_ms,
            )
            if len(claimed) >= limit:
                break
        return claimed

    def _dispatch(self, batch: list[ClaimedTask]) -> None:
        jobs, failures = [], []
        for claimed in batch:
            try:
                jobs.append(self._job(claimed))
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
        for job in jobs:
            self._work.put(job)
        for outcome in failures:
            logger.error(
                "archiving task %r of queue %r: %s",
                outcome.claimed.id,
                outcome.claimed.queue,
                outcome.failure.error,
            )
            self._outcomes.put(outcome)

    def _job(self, claimed: ClaimedTask) -> Job:
        """Make a job of a claimed task, or raise Unrunnable saying why it cannot run."""
        if claimed.raw_message is None:
            raise Unrunnable(None) from NonRetryableError("the task's message is missing")
        try:
            message = TaskMessage.from_json(claimed.raw_message)
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
                if job is None:
                    return
                if job.task_type.is_async and loop is None:
                    loop = asyncio.new_event_loop()
                if not self._run(job, loop if job.task_type.is_async else None):
                    return  # this thread was abandoned; a fresh one took its place
        except BaseException:
            # An interruption meant for an abandoned job may land after its handler returned.
            if threading.current_thread() in self._threads:
                logger.exception("executor thread failed")
        finally:
            if loop is not None:
                loop.close()
            connections.close_all()  # this thread's own; left open they outlive the worker

    def _run(self, job: Job, loop: asyncio.AbstractEventLoop | None) -> bool:
        """Run one job; return False if this thread was abandoned and must end."""
        with self._cond:
            self._queued -= 1
            if self._queued == 0:
                self._cond.notify_all()  # the fetcher may claim more before the threads idle
            if job.state is JobState.ABANDONED:
                return True
            if job.state is JobState.CANCELLED:
                self._finish_locked(job)
                outcome = Outcome(
                    job=job,
                    claimed=job.claimed,
                    failure=Failure(
                        claimed=job.claimed,
                        message=job.message,
                        error=TaskCancelled("cancelled before it started"),
                    ),
                )
                self._outcomes.put(outcome)
                return True
            job.state = JobState.RUNNING
            job.thread = threading.current_thread()
            job.started_at = time.time()
            self._set_expiry(job)
            self._running[job.id] = job
            set_current_task(
                TaskContext(
                    id=job.id,
                    task=job.message.task,
                    queue=job.claimed.queue,
                    retried=int(job.claimed.info.get("retried", 0)),
                    max_retries=job.message.max_retries,
                    worker_id=self.worker_id,
                    enqueued_at=job.message.enqueued_at,
                    started_at=job.started_at,
                    info=job.claimed.info,
                )
            )
            if loop is not None:
                job.loop = loop
                job.async_task = loop.create_task(self._call_async(job))
        outcome = Outcome(job=job, claimed=job.claimed)
        try:
            close_old_connections()
            if signals.task_started.receivers:
                signals.task_started.send(job.task_type, message=job.message, worker_id=self.worker_id)
            if loop is not None:
                result = self._await(job, loop)
            else:
                result = job.task_type.func(*job.message.args, **job.message.kwargs)
            if signals.task_succeeded.receivers:
                signals.task_succeeded.send(job.task_type, message=job.message, result=result)
            try:
                outcome.result_json = json.dumps(result, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise NonRetryableError(f"the task's return value is not JSON-serializable: {exc}") from exc
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
        with self._cond:
            if job.state is JobState.ABANDONED:
                return False
            job.state = JobState.DONE
            self._running.pop(job.id, None)
            self._finish_locked(job)
            self._outcomes.put(outcome)  # under the lock, so that stop() cannot miss it
        return True

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
        self._cond.notify_all()

    # Timeouts, deadlines and cancellation

    def _watch_loop(self) -> None:
        while not self._stopping.wait(WATCHDOG_INTERVAL):
            now = time.monotonic()
            with self._cond:
                overdue = [
                    job
                    for job in self._running.values()
                    if job.expires_at is not None and job.expires_at <= now
                ]
            for job in overdue:
                self._interrupt(job, self._expiry_error(job))

    def _interrupt(self, job: Job, error: BaseException) -> bool:
        """Stop a running job: fail it now and free its slot, whatever its thread is doing."""
        with self._cond:
            if job.state is not JobState.RUNNING:
                return False
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
            self._outcomes.put(
                Outcome(
                    job=job,
                    claimed=job.claimed,
                    failure=Failure(
                        claimed=job.claimed,
                        message=job.message,
                        error=error,
                        started_at=job.started_at,
                    ),
                )
            )
        logger.warning(
            "stopped task %r (%s) of queue %r: %s",
            job.id,
            job.message.task,
            job.claimed.queue,
            error,
        )
        return True

    # Settling

    def _settle_loop(self) -> None:
        while True:
            first = self._outcomes.get()
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
            if last:
                connections.close_all()  # signal receivers may have used the database
                return

    def _settle(self, batch: list[Outcome]) -> None:
        completions: dict[str, list[Completion]] = defaultdict(list)
        for outcome in batch:
            if outcome.failure is None:
                completions[outcome.claimed.queue].append(self._completion(outcome))
        for queue, done in completions.items():
            write = partial(self.broker.complete, queue, done, worker_id=self.worker_id)
            self._write(write, f"completion of {len(done)} task(s) in queue {queue!r}")
        for outcome in batch:
            if outcome.failure is not None:
                write = partial(settle_failure, self.broker, outcome.failure, worker_id=self.worker_id)
                self._write(
                    write,
                    f"failure of task {outcome.claimed.id!r} in queue {outcome.claimed.queue!r}",
                )
        with self._cond:
            for outcome in batch:
                self._owned.pop(outcome.claimed.id, None)
        if any(outcome.job is not None and outcome.job.message.parent for outcome in batch):
            self.on_commands()

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
            info=info,
            times=times,
            result_json=outcome.result_json,
            retention_ms=int(message.retention * 1000),
            unique_key=message.unique_key,
            notify=child_notice(message),
        )

    def _write(self, write: Any, description: str) -> None:
        try:
            write()
        except BrokerUnavailable as exc:
            logger.warning("could not record the %s (%s); the syncer will retry", description, exc)
            self.syncer.add(SyncRequest(apply=write, description=description, deadline=self._lease_expiry))

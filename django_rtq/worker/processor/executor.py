"""The executor threads: each runs one task at a time as a pipeline of steps, or takes a turn fetching."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections, connections

from ... import signals, tracing
from ...broker.attempt import AttemptInfo, format_traceback
from ...context import RunHandle, TaskContext, set_current_task
from ...exceptions import NonRetryableError, Snooze, StoppedAtCheckpoint, TaskCancelled
from ..outcome import Failure, send_robust
from .fetcher import Fetcher
from .jobs import FETCH, Job, JobState, JobTable, Outcome

logger = logging.getLogger(__name__)
_RESULT_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def set_expiry(job: Job, now: float) -> None:
    """Note when the watchdog must stop the job: at its timeout, or its deadline if sooner
    (`now`: the queue's clock, which deadlines are on)."""
    message = job.message
    seconds = message.timeout
    job.stopped_by_deadline = False
    if message.deadline is not None:
        until_deadline = message.deadline - now
        if seconds is None or until_deadline < seconds:
            seconds, job.stopped_by_deadline = until_deadline, True
    if seconds is not None:
        job.expires_at = time.monotonic() + max(0.0, seconds)


def encode_result(result: Any) -> str:
    """The handler's return value as JSON, or NonRetryableError if it has none."""
    if result is None:  # most handlers return nothing
        return "null"
    try:
        return _RESULT_ENCODER.encode(result)
    except (TypeError, ValueError) as exc:
        raise NonRetryableError(f"the task's return value is not JSON-serializable: {exc}") from exc


class Executor:
    """The executor runs handlers on its threads: sync ones directly, `async def` ones on an
    event loop of the thread's own. The thread that takes the FETCH token from the work queue
    fetches until it is handed a task to run itself (`Fetcher.run()`).

    One task's run (`run()`) is a pipeline: take the job, set its expiry, set the task context,
    call the handler, encode its result, record the outcome.
    """

    def __init__(self, *, jobs: JobTable, fetcher: Fetcher, worker_id: str) -> None:
        self.jobs = jobs
        self.fetcher = fetcher
        self.worker_id = worker_id
        #: The executor threads: an abandoned one leaves the list as a fresh one takes its place.
        self.threads: list[threading.Thread] = []
        #: Called on a thread after each task it ran, before it takes the next one (the server's
        #: look at the memory, for --max-memory-per-child).
        self.after_task: Callable[[], None] | None = None

    def start(self, count: int) -> None:
        for _ in range(count):
            self.start_thread()

    def start_thread(self) -> None:
        thread = threading.Thread(target=self._loop, name=f"rtq-exec-{len(self.threads)}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def replace(self, thread: threading.Thread | None) -> None:
        """Give up a thread whose handler is being interrupted, and start a fresh one in its place
        (the caller holds the job table's lock)."""
        self.threads.remove(thread)
        self.start_thread()

    def end_threads(self) -> None:
        """Have every thread end once it has finished its task."""
        for _ in range(len(self.threads)):
            self.jobs.work.put(None)

    def _loop(self) -> None:
        loop: asyncio.AbstractEventLoop | None = None
        try:
            while True:
                job = self.jobs.work.get()
                if job is FETCH:
                    job = self.fetcher.run()  # a task handed over while idle, or None once stopping
                    if job is None:
                        return  # taking work now could start a task that stop() gives back
                if not isinstance(job, Job):
                    return  # stop() ends the threads
                if job.task_type.is_async and loop is None:
                    loop = asyncio.new_event_loop()
                if not self.run(job, loop if job.task_type.is_async else None):
                    return  # this thread was abandoned (a fresh one took its place) or stopped
                if self.after_task is not None:
                    self.after_task()
        except BaseException:
            # An interruption meant for an abandoned job may land after its handler returned.
            if threading.current_thread() in self.threads:
                logger.exception("executor thread failed")
        finally:
            if loop is not None:
                loop.close()
            connections.close_all()  # this thread's own; left open they outlive the worker

    def run(self, job: Job, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Run one job on this thread (an async one on `loop`); return False if this thread was
        abandoned or stopped and must end."""
        if not self.jobs.start_running(job):
            return True
        context = self._context(job)
        with tracing.attempt(
            job.message, queue=context.queue, number=context.retried + 1, worker_id=self.worker_id
        ) as finish:
            try:
                set_expiry(job, job.started_at)  # the queue's clock, read as the job started
                set_current_task(context)
                result = self._call(job, loop)
                outcome = Outcome(job=job, claimed=job.claimed, result_json=encode_result(result))
                send_robust(signals.task_succeeded, job.task_type, message=job.message, result=result)
            except BaseException as exc:
                if isinstance(exc, StoppedAtCheckpoint):
                    self.jobs.stop_at_checkpoint(job)  # given back uncounted, if shutting down
                failure = Failure(
                    claimed=job.claimed,
                    message=job.message,
                    error=exc,
                    traceback=format_traceback(exc),
                    started_at=job.started_at,
                )
                outcome = Outcome(job=job, claimed=job.claimed, failure=failure)
            finally:
                close_old_connections()
            error = outcome.failure.error if outcome.failure else None
            finish(None if isinstance(error, Snooze) else error)  # a snooze is no failure
        return self._record(job, outcome)

    def _context(self, job: Job) -> TaskContext:
        message, claimed, info = job.message, job.claimed, job.claimed.info
        return TaskContext(
            id=claimed.id,
            task=message.task,
            queue=claimed.queue,
            retried=AttemptInfo.from_mapping(info).retried if info else 0,
            max_retries=message.max_retries,
            worker_id=self.worker_id,
            enqueued_at=message.enqueued_at,
            priority=message.priority,
            process_at=message.process_at,
            started_at=job.started_at,
            deadline=message.deadline,
            info=info,
            handle=RunHandle(
                claimed=claimed,
                worker_id=self.worker_id,
                broker=self.fetcher.broker,
                stopping=self.jobs.stopping,
            ),
        )

    def _call(self, job: Job, loop: asyncio.AbstractEventLoop | None) -> Any:
        """Call the handler and return what it returned."""
        close_old_connections()
        send_robust(signals.task_started, job.task_type, message=job.message, worker_id=self.worker_id)
        job.enter_handler()
        try:
            if loop is None:
                return job.task_type.func(*job.message.args, **job.message.kwargs)
            # From here on the watchdog cancels the task inside its loop (the loop first).
            job.loop = loop
            job.async_task = loop.create_task(self._call_async(job))
            return self._await(job, loop)
        finally:
            job.leave_handler()

    async def _call_async(self, job: Job) -> Any:
        return await job.task_type.func(*job.message.args, **job.message.kwargs)

    def _await(self, job: Job, loop: asyncio.AbstractEventLoop) -> Any:
        try:
            return loop.run_until_complete(job.async_task)
        except asyncio.CancelledError:
            raise job.interrupt_error or TaskCancelled("cancelled") from None

    def _record(self, job: Job, outcome: Outcome) -> bool:
        """Record the outcome in the job table; return whether this thread goes on."""
        outcome.finished_at = self.fetcher.broker.clock()
        self.fetcher.note_run(outcome.finished_at - job.started_at)
        state = self.jobs.finish(job, outcome)
        if state is JobState.STOPPED:
            return threading.current_thread() in self.threads
        return state is JobState.DONE

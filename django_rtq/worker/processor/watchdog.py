"""The watchdog stops handlers: past their timeout or deadline, cancelled, lease lost, or at shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ...exceptions import DeadlineExceeded, LeaseLost, TaskCancelled, TaskTimeout, WorkerShutdown
from .executor import Executor
from .jobs import Job, JobState, JobTable, Outcome

logger = logging.getLogger(__name__)

#: Seconds between the watchdog's looks for tasks past their timeout or deadline.
WATCHDOG_INTERVAL = 0.05
#: Seconds an async task gets to honour a cancellation before its thread is abandoned.
ASYNC_CANCEL_GRACE = 2.0
#: Seconds running handlers get to stop once shutdown interrupts them.
SHUTDOWN_STOP_GRACE = 2.0
#: Share of the lease kept in hand: a worker that could not renew its leases for the rest of
#: it stops its running tasks before the lease can expire and another worker run them.
LEASE_SAFETY = 0.2


def lease_budget(lease_ms: int) -> float:
    """How long (seconds) a lease is relied on after the request that set it was sent: the
    watchdog stops a task whose lease was not renewed for that long, so renewals must be tried
    several times within it (the heartbeater never waits longer between two tries)."""
    return lease_ms / 1000 * (1 - LEASE_SAFETY)


def expiry_error(job: Job) -> BaseException:
    """The error a job past its expiry is stopped with."""
    if job.stopped_by_deadline:
        return DeadlineExceeded("the task's deadline passed")
    return TaskTimeout(f"the task ran longer than its timeout of {job.message.timeout}s")


class Watchdog:
    """The watchdog (every WATCHDOG_INTERVAL) interrupts tasks past their timeout or deadline,
    and stops every task whose lease may run out when the leases could not be renewed. An
    async task is cancelled inside its loop (and abandoned if it ignores that); a sync one gets
    an exception raised in its thread, which is abandoned and replaced by a fresh one, so a
    handler stuck in C code cannot hold a slot. Cancellation and shutdown take the same path.
    """

    def __init__(
        self,
        *,
        jobs: JobTable,
        executor: Executor,
        lease_budget: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.jobs = jobs
        # The clock its passes read (tests pass one they move on); time.monotonic's readings.
        self.monotonic = monotonic
        self.executor = executor
        # How long (seconds) a lease is relied on after the request that set it was sent, and
        # when (monotonic) the heartbeater's last successful renewal was sent.
        self.lease_budget = lease_budget
        self._renewed_at = monotonic()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="rtq-watchdog", daemon=True)
        self.thread.start()

    def lease_extended(self, sent_at: float) -> None:
        """Note that the leases were renewed by a request sent at `sent_at` (time.monotonic())."""
        self._renewed_at = max(self._renewed_at, sent_at)

    def _loop(self) -> None:
        while not self.jobs.stopping.wait(WATCHDOG_INTERVAL):
            try:
                self.run_once()
            except Exception:
                logger.exception("the watchdog's pass failed")

    def run_once(self) -> None:
        """Stop the tasks whose lease may run out, and those past their timeout or deadline."""
        now = self.monotonic()
        if now - self._renewed_at > self.lease_budget:
            self._lose_leases(now)
        with self.jobs.cond:
            running = self.jobs.running.values()
            overdue = [job for job in running if job.expires_at is not None and job.expires_at <= now]
        for job in overdue:
            self.interrupt(job, expiry_error(job))

    def cancel(self, task_id: str) -> bool:
        """Stop a task this worker holds: skip it if it has not started, interrupt it if it runs."""
        with self.jobs.cond:
            job = self.jobs.owned.get(task_id)
            if not isinstance(job, Job):
                return False
            logger.info("cancelling task %r (%s) of queue %r", job.id, job.message.task, job.claimed.queue)
            if self.jobs.cancel_queued_locked(job):
                return True
        return self.interrupt(job, TaskCancelled("cancelled on request"))

    def _lose_leases(self, now: float) -> None:
        """The leases could not be renewed for almost a lease: stop every task whose lease may
        run out (neither renewed nor claimed since) before another worker may take it, and
        settle none of them (the recoverer gives them back)."""
        jobs = self.jobs
        with jobs.cond:
            expiring = [
                job
                for job in jobs.jobs_locked()
                if job.state in (JobState.QUEUED, JobState.RUNNING)
                and now - max(job.claimed_at, self._renewed_at) > self.lease_budget
            ]
            if not expiring:
                return
            running = [job for job in expiring if job.state is JobState.RUNNING]
            jobs.lose_locked([job for job in expiring if job.state is JobState.QUEUED])
        for job in running:
            self.interrupt(job, LeaseLost("the worker could not renew its lease"), settle=False)
        logger.error(
            "could not renew leases for %.1fs: stopped %d running task(s) and dropped %d waiting "
            "one(s); they go back to pending once Redis answers, or their lease expires",
            self.lease_budget,
            len(running),
            len(expiring) - len(running),
        )

    def interrupt(self, job: Job, error: BaseException, *, settle: bool = True) -> bool:
        """Stop a running job and free its slot, whatever its thread is doing: fail it now,
        or with `settle=False` forget it (its task is no longer this worker's)."""
        with self.jobs.cond:
            if job.state is not JobState.RUNNING:
                return False
            if job.async_task is not None and job.interrupt_error is None:
                # An async task is cancelled inside its loop; if it ignores that, it is abandoned.
                if not settle:
                    self.jobs.disown_locked(job)
                job.interrupt_error = error
                job.expires_at = time.monotonic() + ASYNC_CANCEL_GRACE
                job.loop.call_soon_threadsafe(job.async_task.cancel)
                return True
            # Raised while we hold the lock: the thread cannot have ended and its id be reused.
            if not job.interrupt_handler(error):
                return False  # the handler returned meanwhile: its outcome is recorded as usual
            if not settle:
                self.jobs.disown_locked(job)
            self.jobs.abandon_running_locked(job)
            self.executor.replace(job.thread)
            if settle:
                self.jobs.outcomes.put(Outcome.failed(job, error))
        logger.warning(
            "stopped task %r (%s) of queue %r: %s",
            job.id,
            job.message.task,
            job.claimed.queue,
            error,
        )
        return True

    def stop_handlers(self, timeout: float) -> tuple[list[Job], list[Job]]:
        """At shutdown, let running tasks finish for up to `timeout` seconds (or end at their
        next checkpoint: see TaskContext.save_checkpoint), then stop those still running,
        settling none of them. Return those whose handlers stopped, and those
        that did not (stuck in C code); this worker holds the leases of neither any longer."""
        jobs = self.jobs
        deadline = time.monotonic() + timeout
        with jobs.cond:
            while jobs.running and time.monotonic() < deadline:
                jobs.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            stopping = list(jobs.running.values())
            for job in stopping:
                jobs.stop_settling_locked(job)
                self._signal_stop(job, WorkerShutdown("the worker shut down before the task finished"))
            # Handlers that ended at a checkpoint as the worker stopped (context.py): given back
            # with the others once their threads marked them STOPPED.
            stopping += [job for job in jobs.stopped_at_checkpoint if job not in stopping]
            jobs.stopped_at_checkpoint = []
            stop_deadline = time.monotonic() + SHUTDOWN_STOP_GRACE
            while (
                any(job.state is not JobState.STOPPED for job in stopping)
                and time.monotonic() < stop_deadline
            ):
                jobs.cond.wait(0.05)
            stopped = [job for job in stopping if job.state is JobState.STOPPED]
            stuck = [job for job in stopping if job.state is not JobState.STOPPED]
            jobs.let_go_locked(stopping)
        return stopped, stuck

    def _signal_stop(self, job: Job, error: BaseException) -> None:
        """Interrupt a job's handler at shutdown (the caller holds the lock): its thread ends
        with it, marking it STOPPED."""
        if job.async_task is not None:
            job.interrupt_error = error
            job.loop.call_soon_threadsafe(job.async_task.cancel)
        else:
            job.interrupt_handler(error)  # if the handler returned, the thread stops after it

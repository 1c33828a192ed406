"""The fetcher claims tasks in batches, listens for wake-ups and hand-offs, and dispatches them."""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable

from ...broker import Broker, ClaimedTask
from ...broker.limits import NO_LIMITS, FlowLimits
from ...exceptions import BrokerUnavailable, DeadlineExceeded, NonRetryableError
from ..outcome import Failure
from ..subscriber import POLL_SECONDS, Subscriber
from .abilities import LeftForAnother, ReleaseAbilities, message_or_leave, task_type_or_leave
from .jobs import FETCH, Job, JobTable, Outcome, Unrunnable, give_back, ids_by_queue

logger = logging.getLogger(__name__)

#: Seconds a stopping fetcher listens for tasks handed over just before it left the idle lists.
HANDOFF_DRAIN_SECONDS = 0.05
#: Seconds to wait before claiming again after Redis was unreachable.
UNAVAILABLE_BACKOFF = 1.0
#: Longest wait (seconds) between claims while claiming keeps failing for another reason.
MAX_FAILURE_BACKOFF = 30.0
#: Seconds a full fetcher waits between looks at its hand-off channels (a task handed over
#: just as it filled up is given back at once, not left unread with its lease running out).
FULL_POLL_SECONDS = 0.05
#: Handlers shorter than this (seconds, on average of late) make a worker hold more tasks:
#: SHORT_TASKS_BUFFER times its concurrency rather than twice (a task then waits in memory for
#: a few of these durations at most).
SHORT_TASK_SECONDS = 0.05
SHORT_TASKS_BUFFER = 4
#: The most a worker holds of short tasks, times its concurrency, however long a claim's round
#: trip (Redis across a network) takes.
MAX_SHORT_TASKS_BUFFER = 16
#: A claim's round trip is counted as this at most (seconds): one that took longer met a stalled
#: Redis, not a network, and must not keep a worker holding more long after.
MAX_CLAIM_SECONDS = 0.05
#: Weight of the latest handler's duration in the moving average of durations, and of the
#: latest claim's round trip in theirs.
RUN_SECONDS_WEIGHT = 0.2


def held_tasks(concurrency: int, run_seconds: float, claim_seconds: float) -> int:
    """How many claimed tasks a worker may hold, from how long its handlers and its claims' round
    trips took of late: twice its concurrency for long tasks, SHORT_TASKS_BUFFER times for short
    ones, and more while a claim takes longer than the tasks do. A claim is sent once a
    concurrency's worth of room is free, and the threads go on running what is held until it
    comes back: hold what they run in that time too, so that a round trip of milliseconds (Redis
    across a network) leaves no thread waiting for it; at most MAX_SHORT_TASKS_BUFFER times the
    concurrency."""
    if run_seconds >= SHORT_TASK_SECONDS:
        return 2 * concurrency
    held = SHORT_TASKS_BUFFER * concurrency
    if run_seconds > 0 and claim_seconds > run_seconds:
        during_a_claim = math.ceil(concurrency * claim_seconds / run_seconds)
        held = max(held, min(2 * concurrency + during_a_claim, MAX_SHORT_TASKS_BUFFER * concurrency))
    return held


def backoff_seconds(failures: int) -> float:
    """How long to wait before claiming again after `failures` failures in a row."""
    return min(MAX_FAILURE_BACKOFF, UNAVAILABLE_BACKOFF * 2 ** min(failures, 5))


def holds(limits: FlowLimits, queue: str, raw_message: str) -> bool:
    """Is a task handed over one that this worker's limits may hold back? The enqueuer hands
    none such over, unless its deploy's limits differ."""
    if not limits:
        return False
    task = _leading_task(raw_message)
    if task is not None and not limits.holds(queue, task):
        return False  # as the parsed message would say, were it corrupt or not: parsed once, later
    try:
        task = json.loads(raw_message).get("task", "")
    except (ValueError, AttributeError):
        return False  # a corrupt task: archived as usual
    return limits.holds(queue, task)


def _leading_task(raw_message: str) -> str | None:
    """The task type a message names first, as TaskMessage.to_json writes it (`{"task":"<name>"`
    and no escape in the name); None for any other text."""
    if raw_message.startswith(_TASK_PREFIX):
        end = raw_message.find('"', len(_TASK_PREFIX))
        if end > 0:
            task = raw_message[len(_TASK_PREFIX) : end]
            if "\\" not in task:
                return task
    return None


_TASK_PREFIX = '{"task":"'


class Fetcher:
    """The fetcher claims batches of pending tasks (weighted or strict across its queues) when
    there is room, and puts them on the work queue.

    Idle, it waits on a pub/sub wake-up that the broker publishes when a queue's pending set
    goes from empty to non-empty, or for a task the broker hands to it at enqueue. It runs on
    whichever executor thread took the FETCH token (`run()`); handed a task while idle, that
    thread passes the role on and runs the task itself.
    """

    def __init__(
        self,
        *,
        jobs: JobTable,
        broker: Broker,
        worker_id: str,
        queues: dict[str, int],
        concurrency: int,
        lease_budget: float,
        strict: bool = False,
        idle_wait: float = 1.0,
        burst: bool = False,
    ) -> None:
        self.jobs = jobs
        self.broker = broker
        self.worker_id = worker_id
        self.queues = queues
        self.concurrency = concurrency
        self.strict = strict
        self.idle_wait = idle_wait
        self.burst = burst
        #: Set when a burst worker found its queues drained.
        self.drained = threading.Event()
        #: Called by a burst fetcher before it decides that its queues are drained: a count
        #: above 0 (the worker relayed the outbox's due rows to Redis) means they may hold work.
        self.before_drained: Callable[[], int] = lambda: 0
        #: Set once the fetcher stopped (it no longer takes tasks in).
        self.stopped = threading.Event()
        #: How many more tasks it may claim (None: no end); at 0 it claims no more, so that a
        #: worker recycled after so many tasks (--max-tasks-per-child) runs no more than those.
        self.claims_left: int | None = None
        #: The thread fetching now (None while the role passes from one thread to another).
        self.thread: threading.Thread | None = None
        #: While the fetcher listens with nothing to do, a task handed to it is kept for the
        #: fetcher's own thread to run.
        self.listening_idle = False
        # How long handlers took of late, and claims (their round trip), in seconds (moving
        # averages): they set the capacity.
        self._recent_run_seconds = 0.0
        self._recent_claim_seconds = 0.0
        # How long (seconds) a lease is relied on after the request that set it was sent.
        self._lease_budget = lease_budget
        self._failures = 0  # claims that failed in a row, for another reason than Redis away
        # seconds until a rate limit lets a waiting task start, from the last claim (None: no such task)
        self._limit_wait: float | None = None
        # the last claim left tasks that only wait for a free thread (limited ones: never prefetched)
        self._thread_bound = False
        # the flow-control limits the last claim applied
        self._claimed_under: FlowLimits = NO_LIMITS
        #: What this release cannot run, as its claims are told (tasks it leaves for others).
        self.abilities = ReleaseAbilities(broker)
        # the last claim showed parked kinds not judged before: claim again once judged
        self._judged_new = False
        self._kept: Job | None = None
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

    def subscribe(self) -> None:
        """Subscribe to the wake-up and hand-off channels before the first claim, so no wake-up is missed."""
        self._waker.listen(0)

    def start(self) -> None:
        """Hand the fetching role to an executor thread."""
        self.jobs.work.put(FETCH)

    def wait_until_stopped(self) -> None:
        """Wait until the fetcher stopped (once the job table is stopping), or its thread died."""
        while not self.stopped.wait(0.1):
            fetching = self.thread
            if fetching is not None and not fetching.is_alive():
                break  # it died (dead_threads() tells); there is nothing to wait for

    @property
    def capacity(self) -> int:
        """How many claimed tasks not yet finished the worker may hold: those beyond its
        threads wait in memory, so claims come in batches. Short tasks get a deeper buffer (a
        claim's round trip then costs more than the work it brings); long ones a shallow one,
        since a task waiting in one worker's memory is not run by another that is idle."""
        return held_tasks(self.concurrency, self._recent_run_seconds, self._recent_claim_seconds)

    def note_run(self, seconds: float) -> None:
        """Count a handler's duration into the moving average that sets the capacity."""
        # Unlocked: a lost update of a moving average is harmless.
        self._recent_run_seconds += (seconds - self._recent_run_seconds) * RUN_SECONDS_WEIGHT

    def _note_claim(self, seconds: float) -> None:
        """Count a claim's round trip into the moving average that sets the capacity."""
        seconds = min(seconds, MAX_CLAIM_SECONDS)
        self._recent_claim_seconds += (seconds - self._recent_claim_seconds) * RUN_SECONDS_WEIGHT

    def should_claim(self) -> bool:
        """Claim when half the capacity is free, or at once when a thread would otherwise idle;
        after a claim that left tasks waiting only for a free thread, as soon as one frees.
        The caller holds the job table's lock."""
        if self.claims_left is not None and self.claims_left <= 0:
            return False
        if self._thread_bound:
            return self.jobs.in_flight < self.concurrency
        free = self.capacity - self.jobs.in_flight
        return free >= self.concurrency or (free > 0 and self.jobs.queued == 0)

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

    # The loop

    def run(self) -> Job | None:
        """Claim and dispatch tasks until stopping (then return None), or until handed a task
        while idle: then pass the role on to an idle thread and return the task, to run it."""
        self.thread = threading.current_thread()
        self._failures = 0
        stopping = self.jobs.stopping
        while not stopping.is_set():
            self._wait_for_room()
            if stopping.is_set():
                break
            while self._waker.listen(0) is not None:
                pass  # wake-ups that came while we were busy: we are about to claim anyway
            try:
                more = self.run_once()
            except BrokerUnavailable as exc:
                logger.debug("cannot claim tasks: %s", exc)  # the healthchecker tells
                stopping.wait(UNAVAILABLE_BACKOFF)
                continue
            except Exception:
                self._failures += 1
                backoff = backoff_seconds(self._failures)
                logger.exception("claiming tasks failed; trying again in %.0fs", backoff)
                stopping.wait(backoff)
                continue
            if more:
                continue  # the queues may hold more (for a free thread, if thread bound)
            if self.drained.is_set():
                break
            kept = self._wait_for_work()
            if kept is not None:
                self.thread = None
                self.jobs.work.put(FETCH)  # a thread is idle: it was handed this task for one
                return kept
        self.leave_idle()
        self.stopped.set()
        return None

    def run_once(self) -> bool:
        """Claim once, as much as there is room for, and dispatch what came; return whether the
        queues may hold more to claim at once. A burst fetcher finding them drained sets `drained`."""
        with self.jobs.cond:
            free = self.capacity - self.jobs.in_flight
            start_now = max(0, self.concurrency - self.jobs.in_flight)
            if self.claims_left is not None:
                free = min(free, max(0, self.claims_left))
                start_now = min(start_now, free)
        if self.jobs.lost:
            self._give_back_lost()
        claimed_at = time.monotonic()
        claimed = self._claim(free, start_now)
        self._note_claim(time.monotonic() - claimed_at)
        self._failures = 0
        if self.claims_left is not None:
            # Under the lock stop_claiming() takes: what came after it is given back, not run.
            with self.jobs.cond:
                if self.claims_left <= 0 and claimed:
                    for queue in {task.queue for task in claimed}:
                        ids = [task.id for task in claimed if task.queue == queue]
                        self._hand_back(queue, ids, "it came as this worker stopped claiming")
                    return False
                self.claims_left -= len(claimed)
                if claimed:
                    self._dispatch(claimed, claimed_at, self._claimed_under)
        elif claimed:
            self._dispatch(claimed, claimed_at, self._claimed_under)
        if len(claimed) == free or (claimed and self.burst) or self._thread_bound or self._judged_new:
            return True
        if self.burst and not claimed and self._is_drained():
            self.drained.set()
        return False

    def _wait_for_room(self) -> None:
        """Wait until there is room to claim, reading the hand-off channels meanwhile."""
        cond = self.jobs.cond
        while not self.jobs.stopping.is_set():
            with cond:
                if self.should_claim():
                    return
                cond.wait(FULL_POLL_SECONDS)
                if self.should_claim():
                    return
            while self._waker.listen(0) is not None:
                pass

    def _wait_for_work(self) -> Job | None:
        """Wait until a queue gets work (the broker publishes when a queue's pending set goes
        from empty to non-empty), at most `idle_wait` seconds, or until stopped. Return the
        task handed to this worker meanwhile if it is for this thread to run."""
        wait = self.idle_wait if self._limit_wait is None else min(self.idle_wait, self._limit_wait)
        deadline = time.monotonic() + wait
        self.listening_idle = True
        try:
            while not self.jobs.stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._waker.listen(min(remaining, POLL_SECONDS)) is not None:
                    break
        finally:
            self.listening_idle = False
        kept, self._kept = self._kept, None
        return kept

    def leave_idle(self) -> None:
        """Stop being handed tasks; take in those handed over meanwhile (stop() gives them back)."""
        try:
            self.broker.leave_idle(self.queues, worker_id=self.worker_id)
            while self._waker.listen(HANDOFF_DRAIN_SECONDS) is not None:
                pass
        except BrokerUnavailable as exc:
            logger.warning("could not leave the idle lists (%s); their entries expire by themselves", exc)
        self._waker.close()

    # Hand-offs

    def _on_message(self, channel: str, data: str) -> None:
        queue = self._handoff_queues.get(channel)
        if queue is None:
            return
        # A task handed to this worker, already under its lease: "<id>\n<run>\n<message JSON>".
        task_id, _, rest = data.partition("\n")
        run, _, raw_message = rest.partition("\n")
        claimed = ClaimedTask(id=task_id, queue=queue, raw_message=raw_message or None, run=run)
        limits = self.broker.limits()
        if holds(limits, queue, raw_message):
            self._hand_back(queue, [task_id], "a limit may hold it back: it goes through a claim")
            return
        jobs = self.jobs
        with jobs.cond:
            has_room = jobs.in_flight < self.concurrency and not jobs.stopping.is_set()
            # With no task waiting for a thread, a thread idles, to which the fetching passes.
            keep = has_room and self.listening_idle and self._kept is None and jobs.queued == 0
        if has_room:
            # Its lease was set at enqueue, a moment before the message arrived: count from earlier.
            claimed_at = time.monotonic() - self._lease_budget / 4
            if keep:
                taken = self._take_in([claimed], claimed_at, limits)
                self._kept = taken[0] if taken else None
            else:
                self._dispatch([claimed], claimed_at, limits)
            return
        self._hand_back(queue, [task_id], "it came as this worker filled up: another worker will run it")

    def _hand_back(self, queue: str, task_ids: list[str], why: str) -> None:
        """Give back tasks that never started (their leases expire if Redis does not answer)."""
        give_back(self.broker, self.worker_id, {queue: task_ids}, why, quiet=True)

    def _give_back_lost(self) -> None:
        """Give back the tasks of lost leases (raises BrokerUnavailable, keeping them, while
        Redis is away). A task another worker has taken since is not this worker's: skipped."""
        lost = self.jobs.take_lost()
        by_queue = ids_by_queue(lost)
        try:
            give_back(self.broker, self.worker_id, by_queue, "whose lease was lost", keep_on_error=True)
        finally:
            self.jobs.keep_lost([job for job in lost if job.claimed.queue in by_queue])

    # Claiming

    def _claim(self, limit: int, start_now: int) -> list[ClaimedTask]:
        """Claim up to `limit` tasks across the queues; the first `start_now` start at once.

        A short claim registers the worker as idle in that queue; if a later queue then fills
        the batch, the worker leaves those idle lists again, so that nothing is handed to it
        while it has no room.
        """
        claimed: list[ClaimedTask] = []
        self._limit_wait = None
        self._thread_bound = False
        self._judged_new = False
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
                    abilities=self.abilities.current,
                )
            except BrokerUnavailable:
                raise
            except Exception:
                self._queue_failed(queue)
                continue
            self._broken_queues.pop(queue, None)
            if got.unjudged_kinds:
                self.abilities.judge(got.unjudged_kinds)
                self._judged_new = True
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
        backoff = backoff_seconds(failures)
        self._broken_queues[queue] = (time.monotonic() + backoff, failures)
        logger.exception("claiming from queue %r failed; trying it again in %.0fs", queue, backoff)

    def _dispatch(self, batch: list[ClaimedTask], claimed_at: float, limits: FlowLimits) -> None:
        """Take in claimed tasks whose leases were set by a request sent at `claimed_at`
        (monotonic), for the threads to run."""
        for job in self._take_in(batch, claimed_at, limits):
            self.jobs.work.put(job)

    def _take_in(self, batch: list[ClaimedTask], claimed_at: float, limits: FlowLimits) -> list[Job]:
        """Own claimed tasks as jobs (those that cannot run go to be archived); return the jobs.

        `limits` are those the claim applied: a task of a type with limits they did not know (its
        module was first imported just now, to run it) is given back, for a claim to apply them."""
        jobs, failures, unlimited, left = [], [], [], []
        for claimed in batch:
            try:
                job = self._job(claimed)
                job.claimed_at = claimed_at
                if (job.task_type.name not in limits.types and job.task_type.limit is not None) or (
                    job.task_type.name not in limits.partitions and job.task_type.partition_limits is not None
                ):
                    unlimited.append(job)
                    continue
                jobs.append(job)
            except LeftForAnother as exc:
                left.append((claimed, exc))
            except Exception as exc:
                message = exc.message if isinstance(exc, Unrunnable) else None
                failures.append(
                    Outcome(
                        job=None,
                        claimed=claimed,
                        failure=Failure(claimed=claimed, message=message, error=exc.__cause__ or exc),
                    )
                )
        if left:
            self._leave(left)
        self.jobs.take_in(jobs, [outcome.claimed for outcome in failures])
        for outcome in failures:
            logger.error(
                "archiving task %r of queue %r: %s",
                outcome.claimed.id,
                outcome.claimed.queue,
                outcome.failure.error,
            )
            self.jobs.outcomes.put(outcome)
        for queue, task_ids in ids_by_queue(unlimited).items() if unlimited else ():
            logger.info(
                "giving back %d task(s) of queue %r claimed before their type's limits were known",
                len(task_ids),
                queue,
            )
            self._hand_back(queue, task_ids, "claimed before their type's limits were known")
        return jobs

    def _job(self, claimed: ClaimedTask) -> Job:
        """Make a job of a claimed task. Raise LeftForAnother if this release cannot run it
        and another may (an unknown type, a newer format, arguments its handler would not
        take), or Unrunnable saying why no worker can."""
        if claimed.raw_message is None:
            raise Unrunnable(None) from NonRetryableError("the task's message is missing")
        try:
            message = message_or_leave(claimed)
        except ValueError as exc:
            raise Unrunnable(None) from NonRetryableError(f"the task's payload is corrupt: {exc}")
        task_type = task_type_or_leave(message, claimed, self.abilities.signatures_of)
        if message.deadline is not None and message.deadline <= self.broker.clock():
            raise Unrunnable(message) from DeadlineExceeded("the task's deadline passed before it started")
        return Job(claimed=claimed, message=message, task_type=task_type)

    def _leave(self, left: list[tuple[ClaimedTask, LeftForAnother]]) -> None:
        """Park claimed tasks this release cannot run, for a worker that can: uncounted, and
        passed over by this worker's claims from now on."""
        by_queue: dict[str, list[tuple[ClaimedTask, LeftForAnother]]] = {}
        for claimed, reason in left:
            by_queue.setdefault(claimed.queue, []).append((claimed, reason))
        for queue, entries in by_queue.items():
            try:
                self.broker.park(
                    queue,
                    worker_id=self.worker_id,
                    entries=[(claimed.id, claimed.run, why.kind, why.reason) for claimed, why in entries],
                )
            except Exception as exc:
                logger.warning(
                    "could not leave %d task(s) of queue %r for another worker (%s); they go back "
                    "to pending when their leases lapse",
                    len(entries),
                    queue,
                    exc,
                )
                continue
            counts: dict[str, tuple[LeftForAnother, int]] = {}
            for _, why in entries:
                counts[why.kind] = (why, counts.get(why.kind, (why, 0))[1] + 1)
            for kind, (why, count) in counts.items():
                self.abilities.note_left(queue, kind, why.reason, count)

    def _is_drained(self) -> bool:
        with self.jobs.cond:
            if self.jobs.owned:
                return False
        if self.before_drained():
            return False
        for queue in self.queues:
            self.broker.forward(queue)
        return self.broker.is_drained(self.queues)

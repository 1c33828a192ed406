"""The settler writes outcomes to Redis in batches and counts how long attempts ran and waited."""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import connections

from ...broker import Broker, Completion
from ...broker.attempt import AttemptInfo
from ...broker.message import child_notice
from ...broker.timings import Timings
from ...conf import get_settings
from ...exceptions import BrokerUnavailable, Snooze
from ..outcome import log_finished, settle_failure, task_logger, tell_left_out
from ..snoozing import settle_snooze
from ..syncer import Syncer, SyncRequest
from .jobs import JobTable, Outcome

logger = logging.getLogger(__name__)

#: Outcomes settled in one round trip at most.
SETTLE_BATCH = 1000
#: Seconds between two additions of the worker's run and wait times to Redis (broker/timings.py).
TIMINGS_FLUSH_SECONDS = 1.0


class Settler:
    """The settler collects outcomes and writes them in batches: one `complete` per queue, one
    `fail` per failure; a write Redis cannot take goes to the syncer. It also counts how long
    each attempt ran and waited, and adds the counts to Redis once a second."""

    def __init__(self, *, jobs: JobTable, broker: Broker, worker_id: str, syncer: Syncer) -> None:
        self.jobs = jobs
        self.broker = broker
        self.worker_id = worker_id
        self.syncer = syncer
        #: Called after settling outcomes that wrote workflow commands (set by the server).
        self.on_commands: Callable[[], None] = lambda: None
        self.thread: threading.Thread | None = None
        self._timings = Timings()
        self._timings_flushed_at = time.monotonic()
        #: Whether each success gets its line (failures always do: outcome.py).
        self.log_successes = get_settings().LOG_FINISHED_TASKS
        #: How often a task may snooze before it is archived (worker/snoozing.py).
        self.max_snoozes = get_settings().MAX_SNOOZES

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="rtq-settle", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while self.run_once():
            pass
        connections.close_all()  # signal receivers may have used the database

    def run_once(self) -> bool:
        """Settle the outcomes that came, SETTLE_BATCH at most, waiting for the first no longer
        than until the timings are due; return False once told to stop (after the last ones)."""
        outcomes = self.jobs.outcomes
        try:  # with counts to add, no longer than until they are due
            first = outcomes.get(timeout=TIMINGS_FLUSH_SECONDS if self._timings else None)
        except queue_module.Empty:
            self._flush_timings()
            return True
        batch = [first] if first is not None else []
        last = first is None
        while not last and len(batch) < SETTLE_BATCH:
            try:
                outcome = outcomes.get_nowait()
            except queue_module.Empty:
                break
            if outcome is None:
                last = True
            else:
                batch.append(outcome)
        if batch:
            waiting: list[Outcome] = []
            try:
                waiting = self._settle(batch)
            except Exception:
                logger.exception("settling %d outcome(s) failed", len(batch))
            finally:
                held = {id(outcome) for outcome in waiting}
                self.jobs.settled([outcome for outcome in batch if id(outcome) not in held])
            self._observe(batch)
        if last or time.monotonic() - self._timings_flushed_at >= TIMINGS_FLUSH_SECONDS:
            self._flush_timings()
        return not last

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
                ok=outcome.failure is None or isinstance(outcome.failure.error, Snooze),
                waited=waited,
            )

    def _flush_timings(self) -> None:
        self._timings_flushed_at = time.monotonic()
        try:
            self._timings.flush(self.broker.add_timings)
        except Exception as exc:  # metrics: kept for the next flush, never in the way of tasks
            logger.debug("could not add run times to Redis yet: %s", exc)

    def _settle(self, batch: list[Outcome]) -> list[Outcome]:
        """Write the batch's outcomes; return those whose writes wait in the syncer."""
        completions: dict[str, list[Completion]] = defaultdict(list)
        succeeded: dict[str, list[Outcome]] = defaultdict(list)
        for outcome in batch:
            if outcome.failure is None:
                completions[outcome.claimed.queue].append(self._completion(outcome))
                succeeded[outcome.claimed.queue].append(outcome)
        waiting: list[Outcome] = []
        for queue, done in completions.items():
            write = partial(self._complete, queue, done, succeeded[queue])
            description = f"completion of {len(done)} task(s) in queue {queue!r}"
            waiting += self._write(write, description, succeeded[queue])
        for outcome in batch:
            if outcome.failure is not None:
                description = f"failure of task {outcome.claimed.id!r} in queue {outcome.claimed.queue!r}"
                write = partial(settle_failure, self.broker, outcome.failure, worker_id=self.worker_id)
                if isinstance(outcome.failure.error, Snooze):
                    description = f"snooze of task {outcome.claimed.id!r} in queue {outcome.claimed.queue!r}"
                    write = partial(
                        settle_snooze,
                        self.broker,
                        outcome.failure,
                        worker_id=self.worker_id,
                        max_snoozes=self.max_snoozes,
                    )
                waiting += self._write(write, description, [outcome])
        if any(outcome.job is not None and outcome.job.message.parent for outcome in batch):
            self.on_commands()
        return waiting

    def _complete(self, queue: str, done: list[Completion], outcomes: list[Outcome]) -> None:
        settled = self.broker.complete(queue, done, worker_id=self.worker_id)
        if self.log_successes and task_logger.isEnabledFor(logging.INFO):
            for outcome in outcomes:
                job = outcome.job
                duration = outcome.finished_at - job.started_at
                said = f"succeeded in {duration:.3f}s"
                name = job.message.task
                log_finished(logging.INFO, job.id, name, queue, said, outcome="succeeded", duration=duration)
        if settled < len(done):
            runs = {completion.id: completion.run for completion in done}
            tell_left_out(self.broker, queue, runs, settled=settled, what="result")

    def _completion(self, outcome: Outcome) -> Completion:
        job = outcome.job
        message = job.message
        info, times = {}, None
        if not message.retention and not self.broker.mirror:
            pass  # nothing of the attempt is kept
        elif job.claimed.info:
            facts = AttemptInfo.from_mapping(job.claimed.info)
            info = facts.succeeded(self.worker_id, job.started_at, outcome.finished_at)
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

    def _write(self, write: Any, description: str, outcomes: list[Outcome]) -> list[Outcome]:
        """Make a write now, or have the syncer retry it while Redis cannot take it; return the
        `outcomes` it writes if it waits in the syncer. Their tasks stay the worker's (their
        leases renewed) until it is made: a Redis that refuses some writes and not others (a
        full one) would otherwise let their leases lapse and another worker run them again. Any
        other error leaves the task to the recoverer (its lease is no longer renewed)."""
        try:
            write()
        except BrokerUnavailable as exc:
            logger.warning("could not record the %s (%s); the syncer will retry", description, exc)
            done = partial(self.jobs.settled, outcomes)
            self.syncer.add(SyncRequest(apply=write, description=description, done=done))
            return outcomes
        except Exception:
            logger.exception(
                "could not record the %s; its task will be taken back once its lease expires", description
            )
        return []

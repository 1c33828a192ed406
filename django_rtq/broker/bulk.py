"""Bulk jobs: an action on every task of some states of a queue, done a page at a time.

A job is a record in the queue's `bulk` hash. Whoever holds its lock carries it on for a
while (the request that started it, a worker's bulk runner, `manage.py rtq_bulk`) and saves
where it got to after each page, so any of them can take over, at any size, and no one call
grows with the queue. A page is one script call, atomic on its own.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import redis

from ..exceptions import InvalidStateTransition
from . import manual
from .broker import Broker
from .errors import translate_errors
from .states import BULK_ACTIONS, Action, TaskState, check_action

#: Tasks acted on per script call.
PAGE = 500
#: How long a lock on a job lasts (seconds): a holder that died is replaced after this.
LOCK_SECONDS = 15
#: The states a purge empties, upstream ones first (active tasks are left to their worker):
#: waiting workflows first, so that they start no more children; then scheduled and retry
#: before pending, so that a task the forwarder moves to pending meanwhile is still caught.
PURGE_STATES = (
    TaskState.WAITING,
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.PENDING,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
)
#: How long a finished job stays listed (seconds), for its progress page and its outcome.
KEEP_FINISHED_SECONDS = 3600


@dataclass(kw_only=True)
class BulkJob:
    """Where an action on whole states has got to."""

    id: str
    queue: str
    action: Action
    states: list[TaskState]  # worked through in this order
    counts: list[int]  # each state's size when the job started, or when the job reached it
    started_at: float
    updated_at: float
    started_by: str = ""
    done: int = 0  # tasks the action moved
    skipped: int = 0  # tasks left in place: workflows, which cannot run again; those a filter leaves
    position: int = 0  # index in `states` of the state being worked on
    offset: int = 0  # skipped tasks at the head of that state's list
    remaining: int | None = None  # tasks that state may still give: its size when reached
    finished_at: float | None = None
    pages: int = 0
    # "run again" narrowed (run only): a task type, the class of the last error ("" for any).
    # Stored only when set, so that a job without them reads in releases that predate them
    # (which find a narrowed one unreadable, and leave it: never run it wider).
    task_name: str = ""
    error_class: str = ""

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def total(self) -> int:
        """Tasks the job expects to act on (the states' sizes, as it found them)."""
        return sum(self.counts)

    @property
    def percent(self) -> int:
        if self.finished:
            return 100
        return min(99, (self.done + self.skipped) * 100 // self.total) if self.total else 0

    @property
    def current_state(self) -> TaskState | None:
        return None if self.finished else self.states[self.position]

    @property
    def narrowed(self) -> bool:
        return bool(self.task_name or self.error_class)

    def to_json(self) -> str:
        data = asdict(self)
        for name in _STORED_WHEN_SET:
            if not data[name]:
                del data[name]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> BulkJob:
        data = json.loads(raw)
        # A field this release does not know makes the job unreadable (see _parse): better left
        # alone than run wider than it was narrowed.
        data["action"] = Action(data["action"])
        data["states"] = [TaskState(state) for state in data["states"]]
        return cls(**data)


def start(
    broker: Broker,
    queue: str,
    action: Action | str,
    states: list[TaskState],
    *,
    started_by: str = "",
    task_name: str = "",
    error_class: str = "",
) -> BulkJob:
    """Record a new job (it does nothing yet: `carry_on` does the work). A run may be narrowed
    to the tasks of one type (`task_name`) and whose last error is of one class (`error_class`)."""
    action = Action(action)
    states = [TaskState(state) for state in states]
    if not states:
        raise InvalidStateTransition(f"{action} of a whole state needs at least one state.")
    if action not in BULK_ACTIONS:
        raise InvalidStateTransition(f"{action} applies to tasks one by one, not to a whole state.")
    if (task_name or error_class) and action != Action.RUN:
        raise InvalidStateTransition(f"Only a run can be narrowed by task type or error class, not {action}.")
    for state in states:
        check_action(action, state)
    qk = broker.queue(queue)
    with translate_errors():
        pipe = broker.client.pipeline(transaction=False)
        for state in states:
            pipe.zcard(qk.state_set(state))
        counts = pipe.execute()
    now = broker.clock()
    job = BulkJob(
        id=uuid.uuid4().hex[:16],
        queue=queue,
        action=action,
        states=states,
        counts=counts,
        started_at=now,
        updated_at=now,
        started_by=started_by,
        task_name=task_name,
        error_class=error_class,
    )
    _save(broker, job)
    return job


def get(broker: Broker, queue: str, job_id: str) -> BulkJob | None:
    with translate_errors():
        raw = broker.client.hget(broker.queue(queue).bulk, job_id)
    return _parse(raw)


def jobs(broker: Broker, queue: str) -> list[BulkJob]:
    """A queue's jobs, the latest first (finished ones stay KEEP_FINISHED_SECONDS)."""
    with translate_errors():
        raws = broker.client.hvals(broker.queue(queue).bulk)
    found = [job for job in map(_parse, raws) if job is not None]
    return sorted(found, key=lambda job: job.started_at, reverse=True)


def carry_on(broker: Broker, queue: str, job_id: str, *, budget: float) -> BulkJob | None:
    """Work on a job for about `budget` seconds (at least one page), unless someone else is
    working on it; return where it got to (None if there is no such job)."""
    qk = broker.queue(queue)
    with translate_errors():
        lock = broker.client.lock(qk.bulk_lock(job_id), timeout=LOCK_SECONDS, blocking=False)
        if not lock.acquire():
            return get(broker, queue, job_id)
    try:
        job = get(broker, queue, job_id)
        deadline = time.monotonic() + budget
        while job is not None and not job.finished:
            _page(broker, job)
            _save(broker, job)
            if time.monotonic() >= deadline:
                break
        return job
    finally:
        # If it cannot be released, it expires: the next one waits LOCK_SECONDS at most.
        with contextlib.suppress(redis.exceptions.RedisError):
            lock.release()


def forget_finished(broker: Broker, queue: str) -> int:
    """Drop jobs finished more than KEEP_FINISHED_SECONDS ago, and unreadable ones; return how many."""
    qk = broker.queue(queue)
    with translate_errors():
        entries = broker.client.hgetall(qk.bulk)
    cutoff = broker.clock() - KEEP_FINISHED_SECONDS
    old = [
        job_id
        for job_id, raw in entries.items()
        if (job := _parse(raw)) is None or (job.finished_at is not None and job.finished_at < cutoff)
    ]
    if old:
        with translate_errors():
            broker.client.hdel(qk.bulk, *old)
    return len(old)


def _page(broker: Broker, job: BulkJob) -> None:
    """Act on the next page of the current state, or move on to the next state."""
    state = job.states[job.position]
    key = broker.queue(job.queue).state_set(state)
    with translate_errors():
        if job.remaining is None:  # the job has just reached this state: bound it by its size now
            job.remaining = broker.client.zcard(key)
            job.counts[job.position] = job.remaining
        size = min(PAGE, job.remaining)
        ids = broker.client.zrange(key, job.offset, job.offset + size - 1) if size > 0 else []
    job.pages += 1
    if not ids:
        _next_state(broker, job)
        return
    skipped = manual.workflow_ids(broker, job.queue, ids) if job.action == Action.RUN else set()
    if job.narrowed:  # those that do not match stay at the head of the list: step over them
        skipped |= set(ids) - manual.matching(broker, job.queue, ids, job.task_name, job.error_class)
    todo = [task_id for task_id in ids if task_id not in skipped]
    if not todo:
        moved = 0
    elif job.narrowed:  # the script checks the filter again, atomically
        moved = manual.run_now(broker, job.queue, todo, only_task=job.task_name, only_error=job.error_class)
    else:
        moved = _ACTS[job.action](broker, job.queue, todo)
    job.done += moved
    job.skipped += len(skipped)
    job.offset += len(skipped)
    # Tasks of the page that left the state meanwhile count too: the state's size when the job
    # reached it bounds the work, so the job ends even while tasks keep arriving.
    job.remaining -= len(ids)
    if job.remaining <= 0:
        _next_state(broker, job)


def _next_state(broker: Broker, job: BulkJob) -> None:
    job.position += 1
    job.offset = 0
    job.remaining = None
    if job.position >= len(job.states):
        job.position = len(job.states) - 1
        job.finished_at = broker.clock()


def _save(broker: Broker, job: BulkJob) -> None:
    job.updated_at = broker.clock()
    with translate_errors():
        broker.client.hset(broker.queue(job.queue).bulk, job.id, job.to_json())


def _parse(raw: Any) -> BulkJob | None:
    if not raw:
        return None
    try:
        return BulkJob.from_json(raw)
    except (ValueError, TypeError, KeyError):
        return None


_STORED_WHEN_SET = ("task_name", "error_class")
_ACTS = {Action.RUN: manual.run_now, Action.ARCHIVE: manual.archive, Action.DELETE: manual.delete}

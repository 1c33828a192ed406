"""The inspector: read queues and tasks in every state (manual actions are in manual.py).

django_rtq.operations reads through it for every surface; it is not on the hot path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from ..exceptions import TaskNotFound
from .attempt import AttemptInfo
from .broker import Broker, utc_day
from .claims import PARKED_BASE
from .errors import translate_errors
from .limits import (
    HELD_BASE,
    PARTITION_SEPARATOR,
    QUEUE_SCOPE,
    Limit,
    bucket_tokens,
    partition_scope,
    scope_label,
    split_scope,
)
from .message import TaskMessage
from .states import TaskState
from .timings import Histogram, histograms
from .workflow import child_id

logger = logging.getLogger(__name__)

#: Tasks a search by task name looks at, from the start of a list (bounded: a list may hold millions).
NAME_SEARCH_SCAN = 1000
#: States whose lists show the newest first.
NEWEST_FIRST = (TaskState.ARCHIVED, TaskState.COMPLETED)
#: Task types holding tasks back without a limit in force that `limit_use` looks for, at most:
#: one round trip each, and only when the held index holds tasks of types it was not told of.
HELD_TYPES_SCAN = 100


#: The states whose sizes QueueStats has, in the order of its fields.
STATS_STATES = (
    TaskState.PENDING,
    TaskState.ACTIVE,
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
    TaskState.WAITING,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """A queue's size in each state, today's counters, and whether it is paused."""

    queue: str
    pending: int
    active: int
    scheduled: int
    retry: int
    archived: int
    completed: int
    processed_today: int  # attempts finished today (UTC), successful or not
    failed_today: int
    paused: bool
    oldest_pending_age: float | None  # seconds since the next pending task was enqueued
    waiting: int = 0  # workflows waiting for their children
    snoozed_today: int = 0  # attempts that snoozed today (UTC): scheduled again, not counted

    @property
    def size(self) -> int:
        return (
            self.pending + self.active + self.scheduled + self.retry + self.archived + self.completed
            + self.waiting
        )  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskInfo:
    """A task as the inspector sees it."""

    id: str
    queue: str
    state: TaskState
    message: TaskMessage | None  # None when the stored message is corrupt
    raw_message: str | None
    attempt: AttemptInfo = field(default_factory=AttemptInfo)  # retried, errors, times, workers
    result: Any = None
    score_at: float | None = None  # epoch seconds: next attempt, archived at, lease or retention end
    owner: str | None = None  # worker holding an active task
    began_at: float | None = None  # epoch seconds: when an active task's run began, once noted
    # {"done", "total"}: what a running task reported, or a workflow's finished children
    progress: dict[str, Any] | None = None
    # a waiting workflow's own facts: kind, stage, counters (see workflows/planner.py)
    workflow: dict[str, Any] | None = None
    # pending, but held back by its type's flow-control limits (broker/limits.py, HELD_BASE)
    held: bool = False
    # pending, left by a worker that could not run it for one that can (broker/waiting.py)
    waits_for_worker: bool = False

    @property
    def children(self) -> list[str]:
        """Ids of a waiting workflow's children that have started and not finished."""
        if not self.workflow:
            return []
        return [child_id(self.id, name[6:]) for name in self.workflow if name.startswith("queue:")]

    @property
    def info(self) -> dict[str, Any]:
        """The attempt facts as stored (a copy)."""
        return self.attempt.as_dict()

    @property
    def retried(self) -> int:
        return self.attempt.retried

    @property
    def last_error(self) -> str | None:
        return self.attempt.error


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitUse:
    """One flow-control scope of a queue: its limit and how much of it is used now."""

    # a task type's name, QUEUE_SCOPE ("*") for the queue's own limit, "<task>\2<partition>" for a
    # partition's, "<task>\2" for the limits each partition of a type has (no use of its own)
    scope: str
    limit: Limit | None  # None when only use is left: a previous deploy's limit, still draining
    running: int  # concurrency slots its active tasks hold
    held: int  # its tasks held back (always 0 for the queue's scope: it caps claims instead)
    tokens: float | None  # starts its rate limit allows at once now; None without a rate limit

    @property
    def task(self) -> str | None:
        """The task type whose scope it is (its partitions' included); None for the queue's own."""
        return split_scope(self.scope)[0]

    @property
    def partition(self) -> str | None:
        """The partition whose scope it is; "" for the limits each partition has; None for others."""
        return split_scope(self.scope)[1]

    @property
    def label(self) -> str:
        """The scope for people ("crm.tasks.sync · partition acme"): see `scope_label`."""
        return scope_label(self.scope)

    @property
    def in_use(self) -> bool:
        """Whether anything counts against it now: a running or held task, or a bucket not full."""
        full = self.limit is None or self.tokens is None or self.tokens >= self.limit.burst
        return bool(self.running or self.held or not full)

    def as_dict(self) -> dict[str, Any]:
        """As JSON-ready data, the same for the API and `rtq_stats --json`."""
        limit = self.limit
        return {
            "scope": self.scope,
            "task": self.task,
            "partition": self.partition,
            "label": self.label,
            "limit": {
                "rate_limit": limit.rate_limit,
                "burst": limit.burst if limit.rate is not None else None,
                "max_concurrency": limit.max_concurrency,
                "description": limit.describe(),
            }
            if limit
            else None,
            "running": self.running,
            "held": self.held,
            "tokens": self.tokens,
        }

    @property
    def next_start_in(self) -> float | None:
        """Seconds until its rate limit allows one more start; 0 now; None without a rate limit."""
        if self.limit is None or self.limit.rate is None or self.tokens is None:
            return None
        return max(0.0, (1 - self.tokens) * self.limit.period / self.limit.rate)


class Inspector:
    """Queries and manual actions over the broker's Redis state."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.client = broker.client

    # Queues

    def queues(self) -> list[str]:
        return self.broker.known_queues()

    def queue_stats(self, queue: str) -> QueueStats:
        qk = self.broker.queue(queue)
        day = utc_day(self.broker.clock())
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for state in STATS_STATES:
                pipe.zcard(qk.state_set(state))
            pipe.get(qk.processed(day))
            pipe.get(qk.failed(day))
            pipe.exists(qk.paused)
            pipe.zrange(qk.pending, 0, 0)
            pipe.get(qk.snoozed(day))
            (
                pending,
                active,
                scheduled,
                retry,
                archived,
                completed,
                waiting,
                processed,
                failed,
                paused,
                head,
                snoozed,
            ) = pipe.execute()
            oldest_age = None
            if head:
                raw = self.client.hget(qk.msg, head[0])
                try:
                    message = TaskMessage.from_json(raw, id=head[0], queue=queue)
                    oldest_age = max(0.0, self.broker.clock() - message.enqueued_at)
                except (TypeError, ValueError):
                    oldest_age = None
        return QueueStats(
            queue=queue,
            pending=pending,
            active=active,
            scheduled=scheduled,
            retry=retry,
            archived=archived,
            completed=completed,
            processed_today=int(processed or 0),
            failed_today=int(failed or 0),
            paused=bool(paused),
            oldest_pending_age=oldest_age,
            waiting=waiting,
            snoozed_today=int(snoozed or 0),
        )

    def all_stats(self) -> list[QueueStats]:
        return [self.queue_stats(queue) for queue in self.queues()]

    def history(self, queue: str, days: int = 14) -> list[tuple[str, int, int]]:
        """Return (day, processed, failed) for the last `days` UTC days, oldest first."""
        qk = self.broker.queue(queue)
        today = datetime.fromtimestamp(self.broker.clock(), UTC).date()
        dates = [(today - timedelta(days=n)).isoformat() for n in range(days - 1, -1, -1)]
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for day in dates:
                pipe.get(qk.processed(day))
                pipe.get(qk.failed(day))
            values = pipe.execute()
        return [(day, int(values[2 * i] or 0), int(values[2 * i + 1] or 0)) for i, day in enumerate(dates)]

    def workers(self) -> list[dict[str, Any]]:
        return self.broker.workers()

    def live_worker_ids(self) -> list[str]:
        """The ids of the workers whose heartbeat is current: one read, nothing removed."""
        with translate_errors():
            return self.client.zrangebyscore(self.broker.keys.workers, f"({self.broker.now_ms()}", "+inf")

    def worker_infos(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """The info of each of these workers that still has one; info that is not a JSON object
        is left out."""
        if not ids:
            return {}
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)  # not MGET: on a cluster, the keys' slots differ
            for worker_id in ids:
                pipe.get(self.broker.keys.worker(worker_id))
            raws = pipe.execute()
        infos = {}
        for worker_id, raw in zip(ids, raws, strict=True):
            try:
                info = json.loads(raw) if raw else None
            except ValueError:
                info = None
            if isinstance(info, dict):
                infos[worker_id] = info
        return infos

    def limit_use(self, queue: str, limits: Mapping[str, Limit]) -> list[LimitUse]:
        """The flow-control scopes of a queue, the queue's own first, then task types by name (each
        followed by its partitions'): each scope of `limits` (the limits in force) and each with use
        left in Redis (slots held, a bucket, tasks held back) without a limit in force any more. A
        partition's scope has its own limit if its type names it, else the type's for each
        partition. One pipelined round trip; when tasks are held in scopes `limits` does not name,
        one more to count those of the scopes in use (slots held, a bucket refilling: a partition's,
        say), then one per other scope holding tasks back (up to HELD_TYPES_SCAN)."""
        qk = self.broker.queue(queue)
        types = [scope for scope in limits if scope != QUEUE_SCOPE]
        # The broker's clock, not the Redis server's that stamps the buckets: a few ms apart.
        now_ms = self.broker.now_ms()
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(qk.running)
            pipe.hgetall(qk.buckets)
            pipe.zcard(qk.held)
            for scope in types:
                pipe.zlexcount(qk.held, *_held_range(scope))
            running, buckets, held_total, *counts = pipe.execute()
            held = dict(zip(types, counts, strict=True))
            if held_total > sum(held.values()):
                in_use = [
                    scope
                    for scope in {*running, *buckets}
                    if scope not in held
                    and scope != QUEUE_SCOPE
                    and (scope in running or _refilling(buckets[scope], _limit_of(scope, limits), now_ms))
                ]
                pipe = self.client.pipeline(transaction=False)
                for scope in in_use:
                    pipe.zlexcount(qk.held, *_held_range(scope))
                held.update(zip(in_use, pipe.execute() if in_use else [], strict=True))
            if held_total > sum(held.values()):
                held.update(self._held_by_other_types(qk.held, set(held), held_total - sum(held.values())))
        scopes = {*limits, *running, *buckets, *(scope for scope, count in held.items() if count)}
        records = []
        for scope in sorted(scopes, key=lambda scope: (scope != QUEUE_SCOPE, scope)):
            limit = _limit_of(scope, limits)
            if split_scope(scope)[1] == "":  # the limits each partition has: shown, never used itself
                records.append(LimitUse(scope=scope, limit=limit, running=0, held=0, tokens=None))
                continue
            records.append(
                LimitUse(
                    scope=scope,
                    limit=limit,
                    running=_whole(running.get(scope)),
                    held=0 if scope == QUEUE_SCOPE else held.get(scope, 0),
                    tokens=bucket_tokens(buckets.get(scope), limit, now_ms) if limit else None,
                )
            )
        return records

    def scope_use(self, queue: str, scope: str, limit: Limit | None) -> LimitUse:
        """The use of one flow-control scope of a queue under `limit` (a partition's that
        `limit_use` did not walk to, say): one pipelined round trip."""
        qk = self.broker.queue(queue)
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(qk.running, scope)
            pipe.hget(qk.buckets, scope)
            pipe.zlexcount(qk.held, *_held_range(scope))
            running, bucket, held = pipe.execute()
        tokens = bucket_tokens(bucket, limit, self.broker.now_ms()) if limit else None
        return LimitUse(scope=scope, limit=limit, running=_whole(running), held=held, tokens=tokens)

    def held_in_partitions(self, queue: str, tasks: Iterable[str]) -> dict[str, int]:
        """How many tasks of each of `tasks` their partition's limits (or a snooze holding their
        partition) hold back in a queue, all partitions summed, exactly: one pipelined round trip
        whatever their number (`limit_use` counts partitions one by one, HELD_TYPES_SCAN at most)."""
        names = sorted(set(tasks))
        if not names:
            return {}
        key = self.broker.queue(queue).held
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for task in names:
                pipe.zlexcount(key, *_partitions_held_range(task))
            return dict(zip(names, pipe.execute(), strict=True))

    def _held_by_other_types(self, key: str, known: set[str], missing: int) -> dict[str, int]:
        """Count the `missing` held tasks of types in the held index but not in `known`, walking
        the index type by type: one round trip each, HELD_TYPES_SCAN types at most."""
        counts: dict[str, int] = {}
        head = self.client.zrangebylex(key, "-", "+", start=0, num=1)
        for _ in range(HELD_TYPES_SCAN):
            if not head or missing <= 0:
                break
            scope = head[0].partition("\0")[0]
            pipe = self.client.pipeline(transaction=False)
            if scope not in known:
                pipe.zlexcount(key, *_held_range(scope))
            pipe.zrangebylex(key, f"[{scope}\1", "+", start=0, num=1)
            *count, head = pipe.execute()
            if count:
                counts[scope] = count[0]
                missing -= count[0]
        return counts

    def task_timings(self, queue: str) -> tuple[list[Histogram], list[Histogram]]:
        """How long a queue's attempts ran, by task type and outcome, and how long its first
        attempts waited to start, by task type (broker/timings.py)."""
        return histograms(self.broker.timings(queue))

    # Tasks

    def count(self, queue: str, state: TaskState | str) -> int:
        with translate_errors():
            return self.client.zcard(self.broker.queue(queue).state_set(TaskState(state)))

    def list_tasks(
        self, queue: str, state: TaskState | str, *, offset: int = 0, limit: int = 20, reverse: bool = False
    ) -> list[TaskInfo]:
        """Return a page of a queue's tasks in a state: pending in the order they will run,
        scheduled and retry by due time, archived and completed newest first; or, with
        `reverse`, the other way round (the other end of the same ZRANGE)."""
        state = TaskState(state)
        qk = self.broker.queue(queue)
        with translate_errors():
            ids_scores = self.client.zrange(
                qk.state_set(state),
                offset,
                offset + limit - 1,
                desc=(state in NEWEST_FIRST) != reverse,
                withscores=True,
            )
        return self._load(queue, state, ids_scores)

    def memory_usage(self, queue: str) -> int | None:
        """Bytes Redis uses for a queue's fixed keys (state sets, task columns, counters of the
        queue, commands), by `MEMORY USAGE`: one pipelined round trip. Keys named per task or per
        day (workflows, uniqueness locks, daily counters) are left out: finding them needs a SCAN."""
        qk = self.broker.queue(queue)
        keys = [
            *(qk.state_set(state) for state in TaskState),
            *qk.columns,
            qk.unstarted,
            qk.began,
            qk.seq,
            qk.paused,
            qk.idle,
            qk.periodic,
            qk.finished,
            qk.bulk,
            qk.commands,
            qk.command,
            qk.applied,
            qk.timings,
        ]
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                # Redis's default sampling: exact sizes would walk every task of every column.
                pipe.memory_usage(key)
            try:
                sizes = pipe.execute()
            except redis.ResponseError:  # MEMORY refused (an ACL, a managed Redis, fakeredis)
                return None
        return sum(size or 0 for size in sizes)

    def search_by_name(
        self,
        queue: str,
        state: TaskState | str,
        text: str,
        *,
        partition: str | None = None,
        scan: int = NAME_SEARCH_SCAN,
    ) -> list[TaskInfo]:
        """Return the tasks among the first `scan` of a list (in `list_tasks` order) whose task
        name contains `text`, ignoring case, and, given a `partition`, that are of that partition.
        Bounded on purpose: it reads `scan` messages."""
        state = TaskState(state)
        qk = self.broker.queue(queue)
        needle = text.casefold()
        with translate_errors():
            ids_scores = self.client.zrange(
                qk.state_set(state), 0, scan - 1, desc=state in NEWEST_FIRST, withscores=True
            )
            raws = self.client.hmget(qk.msg, [task_id for task_id, _ in ids_scores]) if ids_scores else []
        matches = []
        for (task_id, score), raw in zip(ids_scores, raws, strict=True):
            try:
                stored = json.loads(raw) if raw else {}
                name, its_partition = stored.get("task"), stored.get("partition")
            except (ValueError, AttributeError):
                name, its_partition = None, None
            if not isinstance(name, str) or needle not in name.casefold():
                continue
            if partition is None or its_partition == partition:
                matches.append((task_id, score))
        return self._load(queue, state, matches)

    def get_task(self, task_id: str, queue: str | None = None) -> TaskInfo:
        """Find a task by id, in `queue` or, without one, in every known queue."""
        for name in [queue] if queue else self.queues():
            qk = self.broker.queue(name)
            with translate_errors():
                state = self.client.hget(qk.state, task_id)
                if state is None:
                    continue
                score = self.client.zscore(qk.state_set(state), task_id)
            return self._load(name, TaskState(state), [(task_id, score)])[0]
        raise TaskNotFound(f"No task with id {task_id!r}" + (f" in queue {queue!r}." if queue else "."))

    def locate(self, task_ids: list[str], queue: str | None = None) -> dict[str, tuple[str, TaskState]]:
        """Return {id: (queue, state)} for the ids found, in `queue` or in every known queue:
        one round trip per queue searched."""
        found: dict[str, tuple[str, TaskState]] = {}
        for name in [queue] if queue else self.queues():
            todo = [task_id for task_id in task_ids if task_id not in found]
            if not todo:
                break
            with translate_errors():
                states = self.client.hmget(self.broker.queue(name).state, todo)
            for task_id, state in zip(todo, states, strict=True):
                if state in _STATE_NAMES:
                    found[task_id] = (name, TaskState(state))
        return found

    def runs(self, queue: str, task_ids: list[str]) -> dict[str, str | None]:
        """Return {id: its current run number, None for a task that no longer exists}."""
        if not task_ids:
            return {}
        with translate_errors():
            runs = self.client.hmget(self.broker.queue(queue).runs, task_ids)
        return dict(zip(task_ids, runs, strict=True))

    def _load(
        self, queue: str, state: TaskState, ids_scores: list[tuple[str, float | None]]
    ) -> list[TaskInfo]:
        if not ids_scores:
            return []
        qk = self.broker.queue(queue)
        ids = [task_id for task_id, _ in ids_scores]
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(qk.msg, ids)
            pipe.hmget(qk.info, ids)
            pipe.hmget(qk.result, ids)
            pipe.hmget(qk.owner, ids)
            pipe.hmget(qk.progress, ids)
            if state == TaskState.ACTIVE:
                pipe.hmget(qk.runs, ids)
                pipe.hmget(qk.began, ids)
            if state == TaskState.WAITING:
                for task_id in ids:
                    pipe.hgetall(qk.workflow(task_id))
            messages, infos, results, owners, progresses, *more = pipe.execute()
        tasks = []
        runs, began = more if state == TaskState.ACTIVE else ([None] * len(ids), [None] * len(ids))
        workflows = more if state == TaskState.WAITING else [None] * len(ids)
        for (task_id, score), raw, info, result, owner, progress, workflow, run, run_began in zip(
            ids_scores, messages, infos, results, owners, progresses, workflows, runs, began, strict=True
        ):
            pending = score if state == TaskState.PENDING else None  # its place in pending
            try:
                message = TaskMessage.from_json(raw, id=task_id, queue=queue) if raw else None
            except ValueError:
                message = None
            tasks.append(
                TaskInfo(
                    id=task_id,
                    queue=queue,
                    state=state,
                    message=message,
                    raw_message=raw,
                    attempt=AttemptInfo.from_json(info),
                    result=json.loads(result) if result else None,
                    score_at=score / 1000 if score is not None and state != TaskState.PENDING else None,
                    owner=owner,
                    began_at=_began_at(run, run_began),
                    progress=_workflow_progress(workflow) if workflow else _json(progress),
                    workflow=_workflow_facts(workflow) if workflow else None,
                    held=pending is not None and HELD_BASE <= pending < PARKED_BASE,
                    waits_for_worker=pending is not None and pending >= PARKED_BASE,
                )
            )
        return tasks


_STATE_NAMES = frozenset(TaskState)


def _began_at(run: str | None, began: str | None) -> float | None:
    """When the current run of an active task began (epoch seconds), from its `began` entry
    ("<run>:<ms>", see extend_leases.lua); None if not noted yet, or noted for another run."""
    if not run or not began:
        return None
    noted_run, _, ms = began.partition(":")
    if noted_run != run or not ms.isdigit():
        return None
    return int(ms) / 1000


def _held_range(task: str) -> tuple[str, str]:
    """The ZRANGEBYLEX bounds of a task type's entries in a queue's held index."""
    return f"[{task}\0", f"({task}\1"


def _limit_of(scope: str, limits: Mapping[str, Limit]) -> Limit | None:
    """A scope's limit among `limits`: a partition the type does not name has the type's for
    each partition."""
    limit = limits.get(scope)
    task, partition = split_scope(scope)
    if limit is None and partition and task is not None:
        limit = limits.get(partition_scope(task))
    return limit


def _refilling(raw: str, limit: Limit | None, now_ms: int) -> bool:
    """Whether a bucket is not full: its rate limit may be what holds its scope's tasks back."""
    tokens = bucket_tokens(raw, limit, now_ms) if limit else None
    return limit is not None and tokens is not None and tokens < limit.burst


def _partitions_held_range(task: str) -> tuple[str, str]:
    """The ZRANGEBYLEX bounds of the entries of every partition of a task type in a held index."""
    return f"[{partition_scope(task)}", f"({task}{chr(ord(PARTITION_SEPARATOR) + 1)}"


def _whole(value: str | None) -> int:
    try:
        return max(0, int(value or 0))
    except ValueError:
        return 0


def _json(value: str | None) -> Any:
    return json.loads(value) if value else None


def _workflow_facts(workflow: dict[str, str]) -> dict[str, Any]:
    """A workflow's hash as values (counters as numbers), without its steps' specs nor, while it
    is postponed, the activations it starts with."""
    facts = {}
    for name, value in workflow.items():
        if name.startswith("step:") or name == "start":
            continue
        try:
            facts[name] = json.loads(value)
        except ValueError:
            facts[name] = value
    return facts


def _workflow_progress(workflow: dict[str, str]) -> dict[str, Any]:
    """A workflow's progress: its finished children of all it has (so far, for an iterator).
    A count that is not a number (a corrupt workflow, soon archived) reads as unknown."""
    return {
        "done": _count(workflow.get("done")) or 0,
        "total": _count(workflow.get("n") or workflow.get("made")),
    }


def _count(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None

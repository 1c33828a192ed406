"""The inspector: read queues and tasks in every state, and act on them by hand.

The admin, the API and the management commands all go through it; it is not on the hot path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..exceptions import InvalidStateTransition, TaskNotFound
from .broker import Broker, translate_errors, utc_day
from .message import TaskMessage
from .states import TaskState
from .workflow import cancel_workflow

#: The error type of a workflow cancelled (or deleted) by hand.
CANCELLED = "django_rtq.exceptions.TaskCancelled"
#: Tasks moved per script call when acting on a whole state of a queue.
BULK_PAGE = 500
#: Tasks a search by task name looks at, from the start of a list (bounded: a list may hold millions).
NAME_SEARCH_SCAN = 1000
#: States whose lists show the newest first.
NEWEST_FIRST = (TaskState.ARCHIVED, TaskState.COMPLETED)
#: The states `purge` empties, upstream ones first (active tasks are left to their worker).
PURGE_ORDER = (
    TaskState.SCHEDULED,
    TaskState.RETRY,
    TaskState.PENDING,
    TaskState.ARCHIVED,
    TaskState.COMPLETED,
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
    info: dict[str, Any] = field(default_factory=dict)  # retried, error, traceback, times, worker
    result: Any = None
    score_at: float | None = None  # epoch seconds: next attempt, archived at, lease or retention end
    owner: str | None = None  # worker holding an active task
    # {"done", "total"}: what a running task reported, or a workflow's finished children
    progress: dict[str, Any] | None = None
    # a waiting workflow's own facts: kind, stage, counters (see workflows/planner.py)
    workflow: dict[str, Any] | None = None

    @property
    def children(self) -> list[str]:
        """Ids of a waiting workflow's children that have started and not finished."""
        if not self.workflow:
            return []
        return [f"{self.id}.{name[6:]}" for name in self.workflow if name.startswith("queue:")]

    @property
    def retried(self) -> int:
        return int(self.info.get("retried", 0))

    @property
    def last_error(self) -> str | None:
        return self.info.get("error")


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
            for state in (
                TaskState.PENDING,
                TaskState.ACTIVE,
                TaskState.SCHEDULED,
                TaskState.RETRY,
                TaskState.ARCHIVED,
                TaskState.COMPLETED,
                TaskState.WAITING,
            ):
                pipe.zcard(qk.state_set(state))
            pipe.get(qk.processed(day))
            pipe.get(qk.failed(day))
            pipe.exists(qk.paused)
            pipe.zrange(qk.pending, 0, 0)
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
            ) = pipe.execute()
            oldest_age = None
            if head:
                raw = self.client.hget(qk.msg, head[0])
                try:
                    oldest_age = max(0.0, self.broker.clock() - TaskMessage.from_json(raw).enqueued_at)
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

    def pause(self, queue: str) -> None:
        self.broker.pause(queue)

    def resume(self, queue: str) -> None:
        self.broker.resume(queue)

    def workers(self) -> list[dict[str, Any]]:
        return self.broker.workers()

    # Tasks

    def count(self, queue: str, state: TaskState | str) -> int:
        with translate_errors():
            return self.client.zcard(self.broker.queue(queue).state_set(TaskState(state)))

    def list_tasks(
        self, queue: str, state: TaskState | str, *, offset: int = 0, limit: int = 20
    ) -> list[TaskInfo]:
        """Return a page of a queue's tasks in a state: pending in the order they will run,
        scheduled and retry by due time, archived and completed newest first."""
        state = TaskState(state)
        qk = self.broker.queue(queue)
        with translate_errors():
            ids_scores = self.client.zrange(
                qk.state_set(state),
                offset,
                offset + limit - 1,
                desc=state in NEWEST_FIRST,
                withscores=True,
            )
        return self._load(queue, state, ids_scores)

    def search_by_name(
        self, queue: str, state: TaskState | str, text: str, *, scan: int = NAME_SEARCH_SCAN
    ) -> list[TaskInfo]:
        """Return the tasks among the first `scan` of a list (in `list_tasks` order) whose task
        name contains `text`, ignoring case. Bounded on purpose: it reads `scan` messages."""
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
                name = json.loads(raw).get("task") if raw else None
            except (ValueError, AttributeError):
                name = None
            if isinstance(name, str) and needle in name.casefold():
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
            if state == TaskState.WAITING:
                for task_id in ids:
                    pipe.hgetall(qk.workflow(task_id))
            messages, infos, results, owners, progresses, *workflows = pipe.execute()
        tasks = []
        workflows = workflows or [None] * len(ids)
        for (task_id, score), raw, info, result, owner, progress, workflow in zip(
            ids_scores, messages, infos, results, owners, progresses, workflows, strict=True
        ):
            try:
                message = TaskMessage.from_json(raw) if raw else None
            except ValueError:
                message = None
            tasks.append(
                TaskInfo(
                    id=task_id,
                    queue=queue,
                    state=state,
                    message=message,
                    raw_message=raw,
                    info=json.loads(info) if info else {},
                    result=json.loads(result) if result else None,
                    score_at=score / 1000 if score is not None and state != TaskState.PENDING else None,
                    owner=owner,
                    progress=_workflow_progress(workflow) if workflow else _json(progress),
                    workflow=_workflow_facts(workflow) if workflow else None,
                )
            )
        return tasks

    # Acting on tasks

    def run_now(self, queue: str, task_ids: list[str]) -> int:
        """Move scheduled, retry or archived tasks to pending; return how many moved."""
        qk = self.broker.queue(queue)
        return (
            self.broker.run_script(
                "run_now",
                [qk.state, qk.priority, qk.pending, qk.seq, qk.scheduled, qk.retry, qk.archived],
                [qk.wake_channel, *task_ids],
            )
            if task_ids
            else 0
        )

    def archive(self, queue: str, task_ids: list[str]) -> int:
        """Archive pending, scheduled or retry tasks; return how many moved."""
        qk = self.broker.queue(queue)
        keys = [qk.state, qk.pending, qk.scheduled, qk.retry, qk.archived, qk.msg, qk.commands, qk.command]
        args = [self.broker.now_ms(), *self._with_unique_keys(queue, task_ids, keys)]
        return self.broker.run_script("archive_tasks", keys, args) if task_ids else 0

    def delete(self, queue: str, task_ids: list[str]) -> int:
        """Delete tasks in any state but active; return how many were deleted. A waiting
        workflow is cancelled first (its children that have not started are archived)."""
        qk = self.broker.queue(queue)
        if task_ids:
            with translate_errors():
                states = self.client.hmget(qk.state, task_ids)
            for task_id, state in zip(task_ids, states, strict=True):
                if state == TaskState.WAITING:
                    cancel_workflow(
                        self.broker, queue, task_id, error_type=CANCELLED, message="deleted by hand"
                    )
        keys = [
            qk.msg,
            qk.state,
            qk.info,
            qk.result,
            qk.priority,
            qk.pending,
            qk.scheduled,
            qk.retry,
            qk.archived,
            qk.completed,
            qk.progress,
        ]
        args = self._with_unique_keys(queue, task_ids, keys)
        return self.broker.run_script("delete_tasks", keys, args) if task_ids else 0

    def run_all(self, queue: str, state: TaskState | str) -> int:
        return self._bulk(
            queue,
            state,
            self.run_now,
            allowed=(TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED),
        )

    def archive_all(self, queue: str, state: TaskState | str) -> int:
        return self._bulk(
            queue,
            state,
            self.archive,
            allowed=(TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY),
        )

    def delete_all(self, queue: str, state: TaskState | str) -> int:
        allowed = tuple(s for s in TaskState if s != TaskState.ACTIVE)
        return self._bulk(queue, state, self.delete, allowed=allowed)

    def purge(self, queue: str) -> dict[TaskState, int]:
        """Delete every task of a queue but the active ones; return how many went from each state.

        Scheduled and retry tasks go first, then pending: a task the forwarder moves to pending
        meanwhile is still caught. Each script call deletes one page of `BULK_PAGE` tasks.
        """
        return {state: self.delete_all(queue, state) for state in PURGE_ORDER}

    def cancel(self, task_id: str) -> int:
        """Ask the worker running the task to stop it (it is archived); return listeners reached.

        A waiting workflow is archived as cancelled at once, and its children that have not
        started are archived by a worker soon after; returns 1 then.
        """
        for queue in self.queues():
            with translate_errors():
                state = self.client.hget(self.broker.queue(queue).state, task_id)
            if state == TaskState.WAITING:
                return int(
                    cancel_workflow(
                        self.broker,
                        queue,
                        task_id,
                        error_type=CANCELLED,
                        message="cancelled",
                    )
                )
        return self.broker.request_cancel(task_id)

    def _bulk(
        self, queue: str, state: TaskState | str, action: Any, *, allowed: tuple[TaskState, ...]
    ) -> int:
        state = TaskState(state)
        if state not in allowed:
            raise InvalidStateTransition(
                f"That action applies to tasks in {', '.join(allowed)}, not {state}."
            )
        key = self.broker.queue(queue).state_set(state)
        total = 0
        while True:
            with translate_errors():
                ids = self.client.zrange(key, 0, BULK_PAGE - 1)
            moved = action(queue, ids) if ids else 0
            total += moved
            if moved == 0:
                return total

    def _with_unique_keys(self, queue: str, task_ids: list[str], keys: list[str]) -> list[Any]:
        """Append each task's uniqueness lock to `keys`; return the (id, key index) arguments."""
        if not task_ids:
            return []
        qk = self.broker.queue(queue)
        with translate_errors():
            raws = self.client.hmget(qk.msg, task_ids)
        args: list[Any] = []
        for task_id, raw in zip(task_ids, raws, strict=True):
            index = 0
            try:
                unique_key = TaskMessage.from_json(raw).unique_key if raw else None
            except ValueError:
                unique_key = None
            if unique_key:
                keys.append(qk.unique(unique_key))
                index = len(keys)
            args += [task_id, index]
        return args


def _json(value: str | None) -> Any:
    return json.loads(value) if value else None


def _workflow_facts(workflow: dict[str, str]) -> dict[str, Any]:
    """A workflow's hash as values (counters as numbers), without its steps' specs."""
    facts = {}
    for name, value in workflow.items():
        if name.startswith("step:"):
            continue
        try:
            facts[name] = json.loads(value)
        except ValueError:
            facts[name] = value
    return facts


def _workflow_progress(workflow: dict[str, str]) -> dict[str, Any]:
    """A workflow's progress: its finished children of all it has (so far, for an iterator)."""
    total = workflow.get("n") or workflow.get("made")
    return {"done": int(workflow.get("done") or 0), "total": int(total) if total else None}

"""The inspector: read queues and tasks in every state, and act on them by hand.

The admin, the API and the management commands all go through it; it is not on the hot path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..exceptions import InvalidStateTransition, TaskNotFound
from .broker import Broker, translate_errors, utc_day
from .message import TaskMessage
from .states import TaskState
from .workflow import WORKFLOW_TASKS, cancel_workflow

logger = logging.getLogger(__name__)

#: The error type of a task or workflow archived, deleted or cancelled by hand.
CANCELLED = "django_rtq.exceptions.TaskCancelled"
#: The reasons recorded in the info of tasks ended by hand (their error, in the ORM mirror too).
ARCHIVED_BY_HAND = "archived by hand"
DELETED_BY_HAND = "deleted by hand"
#: Tasks moved per script call when acting on a whole state of a queue.
BULK_PAGE = 500
#: Tasks a search by task name looks at, from the start of a list (bounded: a list may hold millions).
NAME_SEARCH_SCAN = 1000
#: States whose lists show the newest first.
NEWEST_FIRST = (TaskState.ARCHIVED, TaskState.COMPLETED)
#: The states `purge` empties, upstream ones first (active tasks are left to their worker):
#: waiting workflows first, so that they start no more children.
PURGE_ORDER = (
    TaskState.WAITING,
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
        """Move scheduled, retry or archived tasks to pending; return how many moved.

        A workflow is not a runnable task, and a finished one cannot run again: given alone,
        it raises InvalidStateTransition; among other tasks, it is skipped (and not counted).
        """
        if not task_ids:
            return 0
        workflows = self._workflow_ids(queue, task_ids)
        if workflows and len(task_ids) == 1:
            raise InvalidStateTransition(
                f"Task {task_ids[0]!r} is a workflow, and a finished workflow cannot be run again: "
                "enqueue it anew."
            )
        return self._run_now(queue, [task_id for task_id in task_ids if task_id not in workflows])

    def _run_now(self, queue: str, task_ids: list[str]) -> int:
        qk = self.broker.queue(queue)
        keys = [qk.state, qk.priority, qk.pending, qk.seq, qk.scheduled, qk.retry, qk.archived, qk.msg]
        return self.broker.run_script("run_now", keys, [qk.wake_channel, *task_ids]) if task_ids else 0

    def archive(self, queue: str, task_ids: list[str], *, reason: str = ARCHIVED_BY_HAND) -> int:
        """Archive pending, scheduled or retry tasks; return how many moved.

        `reason` is recorded as their error (a `TaskCancelled`); each one's record goes to the
        ORM mirror (when mirroring), and a workflow's child fails its workflow.
        """
        if not task_ids:
            return 0
        qk = self.broker.queue(queue)
        keys = [
            qk.state, qk.pending, qk.scheduled, qk.retry, qk.archived, qk.msg, qk.commands,
            qk.command, qk.info, qk.progress, qk.finished,
        ]  # fmt: skip
        args = [
            self.broker.now_ms(),
            int(self.broker.mirror),
            CANCELLED,
            reason,
            *self._with_unique_keys(queue, task_ids, keys),
        ]
        return self.broker.run_script("archive_tasks", keys, args)

    def delete(self, queue: str, task_ids: list[str]) -> int:
        """Delete tasks in any state but active; return how many were deleted.

        A waiting workflow is cancelled first (its children that have not started are
        archived, its own workflow fails). A task that had not finished (pending, scheduled,
        retry) ends as one archived by hand would, with the reason "deleted by hand": its
        record goes to the ORM mirror (when mirroring), and a workflow's child fails its
        workflow. Then it is gone.
        """
        if not task_ids:
            return 0
        qk = self.broker.queue(queue)
        with translate_errors():
            states = self.client.hmget(qk.state, task_ids)
        for task_id, state in zip(task_ids, states, strict=True):
            if state == TaskState.WAITING:
                cancel_workflow(self.broker, queue, task_id, error_type=CANCELLED, message=DELETED_BY_HAND)
        keys = [
            qk.msg, qk.state, qk.info, qk.result, qk.priority, qk.pending, qk.scheduled, qk.retry,
            qk.archived, qk.completed, qk.progress, qk.runs, qk.finished, qk.commands, qk.command,
        ]  # fmt: skip
        args = [
            self.broker.now_ms(),
            int(self.broker.mirror),
            CANCELLED,
            DELETED_BY_HAND,
            *self._with_unique_keys(queue, task_ids, keys),
        ]
        return self.broker.run_script("delete_tasks", keys, args)

    def run_all(self, queue: str, state: TaskState | str) -> int:
        """Run every task of a state now; return how many moved. Workflows are skipped (a
        finished workflow cannot run again) and left where they are; how many is logged."""
        skipped = 0

        def workflows(queue: str, task_ids: list[str]) -> set[str]:
            nonlocal skipped
            found = self._workflow_ids(queue, task_ids)
            skipped += len(found)
            return found

        moved = self._bulk(
            queue,
            state,
            self._run_now,
            allowed=(TaskState.SCHEDULED, TaskState.RETRY, TaskState.ARCHIVED),
            skip=workflows,
        )
        if skipped:
            logger.warning(
                "run all %s tasks of queue %r: %d workflows skipped (a finished workflow cannot be "
                "run again; enqueue it anew)",
                state,
                queue,
                skipped,
            )
        return moved

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

        Waiting workflows go first, cancelled then deleted: their own workflows fail, and their
        children in other queues are cancelled (a command). Then scheduled and retry tasks,
        then pending: a task the forwarder moves to pending meanwhile is still caught. Tasks
        that had not finished end as `delete` says. Each script call deletes one page of
        `BULK_PAGE` tasks.
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
        self,
        queue: str,
        state: TaskState | str,
        action: Callable[[str, list[str]], int],
        *,
        allowed: tuple[TaskState, ...],
        skip: Callable[[str, list[str]], set[str]] | None = None,
    ) -> int:
        """Apply `action` to every task of a state, a page at a time; return how many it moved.
        Tasks `skip` names are left in place, and paged over."""
        state = TaskState(state)
        if state not in allowed:
            raise InvalidStateTransition(
                f"That action applies to tasks in {', '.join(allowed)}, not {state}."
            )
        key = self.broker.queue(queue).state_set(state)
        total = 0
        kept = 0  # tasks skipped so far: the first ones of the list, as the others leave it
        while True:
            with translate_errors():
                ids = self.client.zrange(key, kept, kept + BULK_PAGE - 1)
            if not ids:
                return total
            skipped = skip(queue, ids) if skip else set()
            todo = [task_id for task_id in ids if task_id not in skipped]
            moved = action(queue, todo) if todo else 0
            total += moved
            kept += len(skipped)
            if moved == 0 and not skipped:
                return total

    def _workflow_ids(self, queue: str, task_ids: list[str]) -> set[str]:
        """The ids, among these, of workflows (see WORKFLOW_TASKS)."""
        with translate_errors():
            raws = self.client.hmget(self.broker.queue(queue).msg, task_ids)
        found = set()
        for task_id, raw in zip(task_ids, raws, strict=True):
            try:
                name = json.loads(raw).get("task") if raw else None
            except (ValueError, AttributeError):
                name = None
            if name in WORKFLOW_TASKS:
                found.add(task_id)
        return found

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

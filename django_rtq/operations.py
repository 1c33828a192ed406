"""The operations layer: what the admin, the API, the commands and the backend read and do.

Every surface turns its input into a call here and the result into its output, nothing more:
which Django permission each operation needs, which states each manual action applies to
(`ACTION_STATES`), where a task is looked for (live, then the mirror's buffer, then the ORM)
and how whole states are acted on (bulk jobs, a page at a time) are decided here once.

`Operations(user)` checks `user`'s permissions on every call and raises Django's
`PermissionDenied`; `Operations()` is trusted code: a command an operator runs at the shell,
the `django.tasks` backend, your own code. `Operations(user, check_permissions=False)` acts
for a user whom another policy already admitted (the API's permission classes): it records
their name (who started a bulk job) without checking again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from .broker import Broker, TaskMessage, bulk, forgetting, manual, workflow
from .broker.bulk import PURGE_STATES, BulkJob
from .broker.inspect import NAME_SEARCH_SCAN, Inspector, LimitUse, QueueStats, TaskInfo
from .broker.limits import QUEUE_SCOPE, Limit, partition_scope
from .broker.snoozing import held_types
from .broker.states import EDIT_STATES, Action, TaskState, allows, skip_reason
from .broker.timings import Histogram
from .broker.waiting import WaitingKind, waiting_for_worker
from .conf import get_settings
from .connection import get_broker
from .exceptions import (
    BulkJobNotFound,
    InvalidArguments,
    InvalidStateTransition,
    QueueInUse,
    QueueNotFound,
    TaskNotFound,
)
from .flow_control import project_limits
from .formats import format_duration, plural
from .message_builder import check_arguments
from .mirror import row_from_record
from .models import FinishedTask, OutboxTask, TaskEdit
from .outbox import OutboxStats, outbox_stats
from .periodic import Schedule, get_schedules
from .permissions import CHANGE_LIVE, EDIT_ARGUMENTS, ENQUEUE, VIEW_HISTORY, VIEW_LIVE, has_permission
from .queue_names import named_queues
from .registry import TaskType, get_task_type, registered_tasks
from .task_view import TaskView, view_of_finished_task, view_of_live_task

#: How long (seconds) a request that starts a bulk job works on it before it answers; a
#: worker's bulk runner, or `manage.py rtq_bulk`, carries on the rest.
REQUEST_BUDGET = 1.0

#: What each manual action did to the tasks, after "3 tasks" (for messages).
DONE = {
    Action.RUN: "moved to pending",
    Action.ARCHIVE: "archived",
    Action.DELETE: "deleted",
    Action.CANCEL: "asked to stop",
}


@dataclass(frozen=True, slots=True)
class TaskRef:
    """Where a task was found."""

    id: str
    queue: str
    state: TaskState


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionReport:
    """What a manual action on tasks by id did."""

    action: Action
    count: int  # tasks moved (cancel: tasks whose stop reached a worker, or waiting workflows ended)
    acted: list[TaskRef]  # tasks found in a state the action applies to
    skipped: list[tuple[TaskRef, str]] = field(default_factory=list)  # and why
    missing: list[str] = field(default_factory=list)  # ids found in no queue
    listeners: int = 0  # cancel: workers the stop requests reached

    @property
    def changed_meanwhile(self) -> int:
        """Tasks that were eligible when looked up but not acted on: they moved meanwhile (or, for
        cancel, no worker was listening)."""
        return len(self.acted) - self.count


WORKFLOW_RUN_REASON = "it is a workflow, and a finished workflow cannot be run again: enqueue it anew"
NEWER_WORKFLOW_REASON = (
    "it is a workflow stored in a format newer than this release reads: act on it from a newer release"
)


class Operations:
    """Reads and manual actions over the queues, as `user` (None: trusted code) may do them."""

    def __init__(
        self, user: Any = None, *, check_permissions: bool = True, broker: Broker | None = None
    ) -> None:
        self.user = user
        self.check_permissions = check_permissions and user is not None
        self._broker = broker

    @cached_property
    def broker(self) -> Broker:
        # Built on first use: reading the ORM mirror needs no Redis (a Cluster client connects at once).
        return self._broker or get_broker()

    @cached_property
    def inspector(self) -> Inspector:
        return Inspector(self.broker)

    # Permissions

    def allows(self, permission: str) -> bool:
        """Whether the user has `permission` (or one that includes it); trusted code has all."""
        if not self.check_permissions:
            return True
        return bool(self.user.is_active and self.user.is_authenticated) and has_permission(
            self.user, permission
        )

    def require(self, *permissions: str) -> None:
        """Raise PermissionDenied unless the user has one of `permissions`."""
        if not any(self.allows(permission) for permission in permissions):
            raise PermissionDenied(f"That needs the permission {' or '.join(permissions)}.")

    @property
    def username(self) -> str:
        """The user's name ("" for trusted code and anonymous users)."""
        if not getattr(self.user, "is_authenticated", False):
            return ""
        get_username = getattr(self.user, "get_username", None)  # any user an API auth class gives
        return str(get_username()) if callable(get_username) else str(self.user)

    def now(self) -> float:
        """The broker's clock (epoch seconds), which times in Redis are relative to."""
        return self.broker.clock()

    # Queues

    def queues(self) -> list[str]:
        """Queues enqueued to at least once, and those in settings.RTQ['QUEUES'], sorted."""
        self.require(VIEW_LIVE)
        return sorted(set(self.inspector.queues()) | set(get_settings().QUEUES))

    def check_queue(self, name: str) -> str:
        """Return `name` if it is a known queue; raise QueueNotFound naming the known ones."""
        known = self.queues()
        if name not in known:
            listed = ", ".join(known) or "none yet"
            raise QueueNotFound(f"Unknown queue {name!r}. Known queues: {listed}.")
        return name

    def queue_stats(self, queue: str) -> QueueStats:
        self.require(VIEW_LIVE)
        return self.inspector.queue_stats(queue)

    def history(self, queue: str, days: int = 14) -> list[tuple[str, int, int]]:
        """(day, processed, failed) for the last `days` UTC days, oldest first."""
        self.require(VIEW_LIVE)
        return self.inspector.history(queue, days)

    def workers(self) -> list[dict[str, Any]]:
        """The live workers, by host, pid and id."""
        self.require(VIEW_LIVE)
        return sorted(
            self.inspector.workers(), key=lambda w: (w.get("host", ""), w.get("pid", 0), w.get("id", ""))
        )

    def is_paused(self, queue: str) -> bool:
        self.require(VIEW_LIVE)
        return self.broker.is_paused(queue)

    def pause(self, queue: str) -> bool:
        """Pause a queue; return whether it changed (False: it was paused already)."""
        return self._switch(queue, pause=True)

    def resume(self, queue: str) -> bool:
        """Resume a queue; return whether it changed (False: it was running already)."""
        return self._switch(queue, pause=False)

    def _switch(self, queue: str, *, pause: bool) -> bool:
        self.require(CHANGE_LIVE)
        self.check_queue(queue)
        if self.broker.is_paused(queue) == pause:
            return False
        (self.broker.pause if pause else self.broker.resume)(queue)
        return True

    def forget_queue(self, queue: str) -> None:
        """Take a queue that nothing uses out of the known queues now, its leftover keys deleted
        (as the janitor does after RTQ["FORGET_EMPTY_QUEUES_AFTER"]); raise QueueInUse saying
        why not: the project names it, or it holds tasks or work. A task enqueued to it later
        lists it again."""
        self.require(CHANGE_LIVE)
        self.check_queue(queue)
        if queue in named_queues():
            raise QueueInUse(
                f"Queue {queue!r} cannot be forgotten: the project names it (RTQ['QUEUES'], "
                "DEFAULT_QUEUE, a task type, a schedule or a TASKS backend), so it is always listed."
            )
        why = forgetting.forget_now(self.broker, queue)
        if why:
            raise QueueInUse(f"Queue {queue!r} cannot be forgotten: {why}.")

    # Flow control

    def flow_control(self, queue: str) -> list[LimitUse]:
        """A queue's flow-control limits with their use now (see `Inspector.limit_use`): its own
        limit, those of the task types whose queue it is (with the limits each of their partitions
        has, and those of the partitions they name), and any other scope in use in it (a type
        enqueued there with `.using(queue=...)`, a previous deploy's limit still draining).

        A partition the type does not name is listed only while it has tasks running or held back:
        tenants can be thousands, and each leaves its rate limit's bucket behind (refilling, then
        full), which holds no task back."""
        self.require(VIEW_LIVE)
        named = {
            partition_scope(task, partition)
            for task, limits in project_limits().partitions.items()
            for partition in limits.named
        }

        def listed(use: LimitUse) -> bool:
            home = _queue_of(use.task) == queue
            if use.partition:
                return bool(use.running or use.held) or (use.scope in named and home)
            return use.limit is None or use.in_use or use.scope == QUEUE_SCOPE or home

        return [use for use in self._limit_use(queue) if listed(use)]

    def held_in_partitions(self, queue: str, uses: Sequence[LimitUse]) -> dict[str, int]:
        """Tasks held back by their partition's limits in a queue, summed per task type, exactly:
        for the partitioned types whose queue it is, and any other type with a partition in `uses`
        (the queue's `flow_control`)."""
        self.require(VIEW_LIVE)
        partitioned = [task for task in project_limits().partitions if _queue_of(task) == queue]
        in_use = [use.task for use in uses if use.partition and use.task]
        return self.inspector.held_in_partitions(queue, [*partitioned, *in_use])

    def all_flow_control(self) -> dict[str, list[LimitUse]]:
        """`flow_control` of every known queue, by queue (an empty list: no limit, no use)."""
        return {queue: self.flow_control(queue) for queue in self.queues()}

    def held_reasons(self, tasks: Sequence[TaskInfo]) -> dict[str, str]:
        """Why each held-back task of `tasks` waits (see `held_reason`), by id: one read of the
        limits' use per queue."""
        self.require(VIEW_LIVE)
        uses: dict[str, dict[str, LimitUse]] = {}
        holds: dict[str, dict[str, int]] = {}
        reasons = {}
        for task in tasks:
            if not task.held:
                continue
            if task.queue not in uses:
                uses[task.queue] = {use.scope: use for use in self._limit_use(task.queue)}
                holds[task.queue] = held_types(self.broker, task.queue)
            reasons[task.id] = self._why_held(task, uses[task.queue], holds[task.queue])
        return reasons

    def _why_held(self, task: TaskInfo, uses: dict[str, LimitUse], held_until: dict[str, int]) -> str:
        """Why a held-back task waits: a snooze holding its type or its partition, else the limits
        of its partition (unless only its type's hold it back now), else its type's."""
        name = task.message.task if task.message else ""
        partition = task.message.partition if task.message else None
        scope = partition_scope(name, partition) if partition is not None else None
        now_ms = self.broker.now_ms()
        if held_until.get(name, 0) > now_ms:
            return snooze_hold_reason(name, (held_until[name] - now_ms) / 1000)
        if scope is None:
            return held_reason(name, uses.get(name))
        if held_until.get(scope, 0) > now_ms:
            return snooze_hold_reason(name, (held_until[scope] - now_ms) / 1000, partition=partition)
        if scope not in uses and (limit := partition_limit(name, partition)):
            # a partition past those limit_use walks to (HELD_TYPES_SCAN): read on its own
            uses[scope] = self.inspector.scope_use(task.queue, scope, limit)
        type_use, partition_use = uses.get(name), uses.get(scope)
        if (
            partition_use
            and partition_use.limit
            and not (type_use and at_limit(type_use) and not at_limit(partition_use))
        ):
            return held_reason(name, partition_use, partition=partition)
        return held_reason(name, type_use)

    def held_reason(self, task: TaskInfo) -> str | None:
        """Why a pending task is held back by its type's (or its partition's) limits ("Held back by
        the limits of its type shop.tasks.pay (at most 3 running): 3 running now..."), or by a
        snooze; None if it is not."""
        return self.held_reasons([task]).get(task.id)

    def _limit_use(self, queue: str) -> list[LimitUse]:
        return self.inspector.limit_use(queue, project_limits().for_queue(queue))

    # Tasks waiting for a worker that can run them (broker/waiting.py)

    def waiting_for_worker(self, queue: str) -> list[WaitingKind]:
        """The kinds of a queue's pending tasks that no worker seen so far could run (an unknown
        type, a stored format newer than it reads, arguments its handler refuses), each with
        how many wait, since when and why, by task name. One HGETALL when none wait."""
        self.require(VIEW_LIVE)
        return waiting_for_worker(self.broker, queue)

    # Reading tasks

    def count(self, queue: str, state: TaskState | str) -> int:
        self.require(VIEW_LIVE)
        return self.inspector.count(queue, state)

    def list_tasks(
        self, queue: str, state: TaskState | str, *, offset: int = 0, limit: int = 20, reverse: bool = False
    ) -> list[TaskInfo]:
        """A page of a queue's tasks in a state (see Inspector.list_tasks for the order)."""
        self.require(VIEW_LIVE)
        return self.inspector.list_tasks(queue, state, offset=offset, limit=limit, reverse=reverse)

    def task_timings(self, queue: str) -> tuple[list[Histogram], list[Histogram]]:
        """Run times by task type and outcome, and waits to start by task type, of a queue."""
        self.require(VIEW_LIVE)
        return self.inspector.task_timings(queue)

    def queue_memory(self, queue: str) -> int:
        """Bytes of Redis memory a queue's keys use (see Inspector.memory_usage)."""
        self.require(VIEW_LIVE)
        return self.inspector.memory_usage(queue)

    def schedules(self) -> list[Schedule]:
        """Every declared periodic schedule, with its last tick dealt with and its next one."""
        self.require(VIEW_LIVE)
        return get_schedules(self.broker)

    def search_by_name(
        self,
        queue: str,
        state: TaskState | str,
        text: str,
        *,
        partition: str | None = None,
        scan: int = NAME_SEARCH_SCAN,
    ) -> list[TaskInfo]:
        """The tasks among the first `scan` of a list whose task name contains `text` (and of
        `partition`, if given)."""
        self.require(VIEW_LIVE)
        return self.inspector.search_by_name(queue, state, text, partition=partition, scan=scan)

    def live_task(self, task_id: str, queue: str | None = None) -> TaskInfo:
        """A task in Redis, in `queue` or in any queue; TaskNotFound if it is not there."""
        self.require(VIEW_LIVE)
        return self.inspector.get_task(task_id, queue)

    def get_task(self, task_id: str, queue: str | None = None) -> TaskView:
        """A task wherever it is (as `find_task` looks), as one view whether it is live or finished:
        `.state` (a finished one is `completed` or `archived`), `.live`, `.result`, `.error`,
        `.retried`, `.worker`, ... (django_rtq/task_view.py). Raises TaskNotFound."""
        found = self.find_task(task_id, queue)
        if isinstance(found, TaskInfo):
            held_back = self.held_reason(found) if found.held else None
            return view_of_live_task(found, held_back)
        return view_of_finished_task(found)

    def find_task(self, task_id: str, queue: str | None = None) -> TaskInfo | FinishedTask:
        """A task wherever it is: live in Redis, else finished, in the mirror's buffer (an unsaved
        row) or in the ORM. Live tasks need VIEW_LIVE, finished ones VIEW_HISTORY. What it finds
        comes as it is stored: the inspector's `TaskInfo` (`.state`, `.result`) or a `FinishedTask`
        row (`.status`, `.return_value`); `get_task` gives either as one `TaskView`."""
        if self.allows(VIEW_LIVE):
            try:
                task = self.inspector.get_task(task_id, queue)
            except TaskNotFound:
                pass
            else:
                if task.raw_message is not None:
                    return task
                # Read as it finished, its columns going: it is finished now, or gone.
        self.require(VIEW_LIVE, VIEW_HISTORY)
        row = self._finished_row(task_id, queue)
        if row is None:
            raise TaskNotFound(_not_found(task_id, queue))
        self.require(VIEW_HISTORY)  # a finished task is history
        return row

    def _finished_row(self, task_id: str, queue: str | None) -> FinishedTask | None:
        queues = [queue] if queue else sorted(set(self.inspector.queues()) | set(get_settings().QUEUES))
        for name, record in self.broker.finished_records(task_id, queues).items():
            return row_from_record(task_id, name, record)
        rows = FinishedTask.objects.using(get_settings().MIRROR_DATABASE).filter(pk=task_id)
        return (rows.filter(queue=queue) if queue else rows).first()

    def finished_tasks(self) -> QuerySet[FinishedTask]:
        """The ORM mirror of finished tasks, in its database."""
        self.require(VIEW_HISTORY)
        return FinishedTask.objects.using(get_settings().MIRROR_DATABASE).all()

    # The transactional outbox (django_rtq/outbox.py): its tasks are live ones not in Redis yet.
    def outbox_stats(self) -> OutboxStats:
        """How many tasks wait in the outbox, and since when."""
        self.require(VIEW_LIVE)
        return outbox_stats()

    def outbox_tasks(self) -> QuerySet[OutboxTask]:
        """The tasks waiting in the outbox, oldest first, in its database."""
        self.require(VIEW_LIVE)
        return OutboxTask.objects.using(get_settings().OUTBOX_DATABASE).order_by("pk")

    def delete_outbox_tasks(self, task_ids: Sequence[str]) -> int:
        """Give up tasks waiting in the outbox (a row that keeps failing to send, say): they are
        never sent. Return how many rows went."""
        self.require(CHANGE_LIVE)
        rows = OutboxTask.objects.using(get_settings().OUTBOX_DATABASE).filter(task_id__in=list(task_ids))
        return rows.delete()[0]

    def locate(self, task_ids: Sequence[str], queue: str | None = None) -> list[TaskRef]:
        """Where each of these live tasks is (ids found nowhere are left out), in the given order."""
        self.require(VIEW_LIVE)
        ids = list(dict.fromkeys(task_ids))
        found = self.inspector.locate(ids, queue)
        return [TaskRef(task_id, *found[task_id]) for task_id in ids if task_id in found]

    # Acting on tasks

    def act(self, action: Action | str, task_ids: Sequence[str], queue: str | None = None) -> ActionReport:
        """Apply a manual action to tasks by id (in `queue`, or wherever each one is).

        Tasks in a state the action does not apply to are skipped, with the reason; a run skips
        workflows. A task that moves meanwhile is left alone by the script, and counted in
        `changed_meanwhile`.
        """
        action = Action(action)
        self.require(CHANGE_LIVE)
        ids = list(dict.fromkeys(task_ids))
        refs = self.locate(ids, queue)
        located = {ref.id for ref in refs}
        acted = [ref for ref in refs if allows(action, ref.state)]
        skipped = [(ref, skip_reason(action, ref.state)) for ref in refs if ref not in acted]
        if action == Action.RUN:
            workflows = set().union(
                *(manual.workflow_ids(self.broker, name, ids) for name, ids in _by_queue(acted).items())
            )
            skipped += [(ref, WORKFLOW_RUN_REASON) for ref in acted if ref.id in workflows]
            acted = [ref for ref in acted if ref.id not in workflows]
        if action in (Action.CANCEL, Action.DELETE):
            waiting = [ref for ref in acted if ref.state == TaskState.WAITING]
            newer = set().union(
                *(
                    workflow.newer_workflows(self.broker, name, ids)
                    for name, ids in _by_queue(waiting).items()
                )
            )
            skipped += [(ref, NEWER_WORKFLOW_REASON) for ref in acted if ref.id in newer]
            acted = [ref for ref in acted if ref.id not in newer]
        count = listeners = 0
        if action == Action.CANCEL:
            for ref in acted:
                reached = manual.cancel(self.broker, ref.queue, ref.id, ref.state)
                listeners += reached
                count += bool(reached)
        else:
            act = {Action.RUN: manual.run_now, Action.ARCHIVE: manual.archive, Action.DELETE: manual.delete}
            count = sum(act[action](self.broker, name, ids) for name, ids in _by_queue(acted).items())
        return ActionReport(
            action=action,
            count=count,
            acted=acted,
            skipped=skipped,
            missing=[task_id for task_id in ids if task_id not in located],
            listeners=listeners,
        )

    def act_on_one(self, action: Action | str, task_id: str, queue: str | None = None) -> ActionReport:
        """Apply an action to one task; TaskNotFound if it is not live, InvalidStateTransition if
        it is in a state the action does not apply to, or left it before the action ran."""
        report = self.act(action, [task_id], queue)
        if report.missing:
            raise TaskNotFound(_not_found(task_id, queue))
        if report.skipped:
            _, reason = report.skipped[0]
            raise InvalidStateTransition(f"Task {task_id!r} was not {DONE[report.action]}: {reason}.")
        if report.count == 0 and report.action == Action.CANCEL:
            raise InvalidStateTransition(f"No worker is listening, so task {task_id!r} was not cancelled.")
        if report.count == 0:
            raise InvalidStateTransition(f"Task {task_id!r} is no longer in a state this applies to.")
        return report

    # Editing a task's arguments, then running it again

    def editable_task(self, task_id: str, queue: str | None = None) -> TaskInfo:
        """A live task whose arguments may be edited (see `edit_and_run`), as it is now; raise
        TaskNotFound, or InvalidStateTransition saying why it may not be."""
        self.require(EDIT_ARGUMENTS)
        task = self.inspector.get_task(task_id, queue)
        if task.state not in EDIT_STATES:
            raise InvalidStateTransition(
                f"Task {task_id!r} is {task.state}: only {' or '.join(EDIT_STATES)} tasks can be edited."
            )
        if task.message is None or task.raw_message is None:
            raise InvalidStateTransition(
                f"Task {task_id!r} cannot be edited: its stored message is not one this release reads."
            )
        if manual.workflow_ids(self.broker, task.queue, [task.id]):
            raise InvalidStateTransition(f"Task {task_id!r} cannot be edited: {WORKFLOW_RUN_REASON}.")
        return task

    def edit_and_run(
        self, task_id: str, args: Sequence[Any], kwargs: dict[str, Any], queue: str | None = None
    ) -> TaskEdit:
        """Replace a failed (retry) or archived task's arguments and move it to pending, recording
        who edited what (a `TaskEdit`, in the mirror's database). The arguments must bind to the
        handler as this process has it and be JSON, as at enqueue: else InvalidArguments.
        InvalidStateTransition if the task may not be edited, or moved or was edited meanwhile
        (then nothing changed and nothing is recorded)."""
        task = self.editable_task(task_id, queue)
        edited = self.check_edit(task, args, kwargs)
        message = task.message
        assert message is not None and task.raw_message is not None  # editable_task checked
        database = get_settings().MIRROR_DATABASE
        # The record commits only if the edit happened: the script runs inside the transaction.
        with transaction.atomic(using=database):
            record = TaskEdit.objects.using(database).create(
                task_id=task.id,
                task_name=message.task,
                queue=task.queue,
                edited_by=self.username,
                edited_at=timezone.now(),
                state=task.state,
                old_args=message.args,
                old_kwargs=message.kwargs,
                new_args=edited.args,
                new_kwargs=edited.kwargs,
            )
            if not manual.edit_and_run(self.broker, task.queue, task.id, task.raw_message, edited):
                raise InvalidStateTransition(
                    f"Task {task_id!r} was not edited: it moved, or someone edited it, meanwhile."
                )
        return record

    def check_edit(self, task: TaskInfo, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskMessage:
        """`task`'s message with these arguments, if its handler (as this process has it) takes
        them and they are JSON, as at enqueue; else InvalidArguments. Nothing changes."""
        self.require(EDIT_ARGUMENTS)
        if task.message is None:
            raise InvalidArguments(f"Task {task.id!r} has no message this release reads.")
        task_type = get_task_type(task.message.task)
        if task_type is None:
            raise InvalidArguments(
                f"Task type {task.message.task!r} is not registered in this process, so new arguments "
                "cannot be checked against its handler: edit it from a process that has it."
            )
        args, kwargs = list(args), dict(kwargs)
        check_arguments(task_type, args, kwargs)
        return dataclasses.replace(task.message, args=args, kwargs=kwargs)

    def task_edits(self, task_id: str) -> QuerySet[TaskEdit]:
        """Who edited a task's arguments, and how, the latest first: for whoever may see the task."""
        self.require(VIEW_LIVE, VIEW_HISTORY)
        return TaskEdit.objects.using(get_settings().MIRROR_DATABASE).filter(task_id=task_id)

    def count_matching(
        self, queue: str, state: TaskState | str, *, task_name: str = "", error_class: str = ""
    ) -> int:
        """How many tasks of a state are of the type `task_name` and last failed with the class
        `error_class` (either "" for any): what a narrowed run would find now."""
        self.require(VIEW_LIVE)
        if not task_name and not error_class:
            return self.inspector.count(queue, state)
        return manual.count_matching(self.broker, queue, TaskState(state), task_name, error_class)

    # Acting on whole states: bulk jobs

    def start_bulk(
        self,
        action: Action | str,
        queue: str,
        states: Sequence[TaskState | str],
        *,
        budget: float | None = None,
        task_name: str = "",
        error_class: str = "",
    ) -> BulkJob:
        """Start acting on every task of `states` of a queue, work on it for `budget` seconds
        (REQUEST_BUDGET by default), and return where it got to: a worker's bulk runner (or
        `rtq_bulk`) does the rest. A run ("run again") may be narrowed to one task type and
        to tasks whose last error is of one class (a dotted path)."""
        action = Action(action)
        self.require(CHANGE_LIVE)
        self.check_queue(queue)
        job = bulk.start(
            self.broker,
            queue,
            action,
            [TaskState(s) for s in states],
            started_by=self.username,
            task_name=task_name,
            error_class=error_class,
        )
        budget = REQUEST_BUDGET if budget is None else budget
        return bulk.carry_on(self.broker, queue, job.id, budget=budget) or job

    def purge(self, queue: str, *, budget: float | None = None) -> BulkJob:
        """Start deleting every task of a queue but the active ones (see PURGE_STATES)."""
        return self.start_bulk(Action.DELETE, queue, PURGE_STATES, budget=budget)

    def bulk_job(self, queue: str, job_id: str) -> BulkJob:
        self.require(VIEW_LIVE)
        job = bulk.get(self.broker, queue, job_id)
        if job is None:
            raise BulkJobNotFound(
                f"No bulk action {job_id!r} on queue {queue!r} (finished ones go after an hour)."
            )
        return job

    def bulk_jobs(self, queue: str | None = None) -> list[BulkJob]:
        """Bulk jobs of a queue, or of every queue, the latest first."""
        self.require(VIEW_LIVE)
        names = [queue] if queue else self.queues()
        found = [job for name in names for job in bulk.jobs(self.broker, name)]
        return sorted(found, key=lambda job: job.started_at, reverse=True)

    def carry_on(self, queue: str, job_id: str, *, budget: float | None = None) -> BulkJob:
        """Work on a bulk job for `budget` seconds (unless someone else is); return where it is."""
        self.require(CHANGE_LIVE)
        budget = REQUEST_BUDGET if budget is None else budget
        job = bulk.carry_on(self.broker, queue, job_id, budget=budget)
        if job is None:
            raise BulkJobNotFound(f"No bulk action {job_id!r} on queue {queue!r}.")
        return job

    # Task types and enqueueing

    def exposed_task_types(self) -> list[TaskType]:
        """The task types exposed to the API, by name: for those who may look or enqueue."""
        self.require(VIEW_LIVE, ENQUEUE)
        return sorted((t for t in registered_tasks().values() if t.exposed), key=lambda t: t.name)

    def exposed_task_type(self, name: str) -> TaskType:
        """The exposed task type of that name; the same TaskNotFound whether unknown or not exposed."""
        for task_type in self.exposed_task_types():
            if task_type.name == name:
                return task_type
        raise TaskNotFound(f"No task type named {name!r} is exposed.")

    def enqueue(
        self, task_type: TaskType, args: Sequence[Any], kwargs: dict[str, Any], **options: Any
    ) -> TaskMessage:
        """Enqueue a call of an exposed task type, as the user."""
        self.require(ENQUEUE)
        return task_type.using(**options).enqueue(*args, **kwargs)


def snooze_hold_reason(task: str, seconds_left: float, *, partition: str | None = None) -> str:
    """Why a task of type `task` is held back while a snooze holds its type, or its partition
    (docs/snooze.md)."""
    if partition is not None:
        return (
            f"Held back for {format_duration(seconds_left)} more: a task of its partition "
            f"{partition} of {task} snoozed holding its partition (Snooze(hold_partition=True)), and "
            "none of the partition starts in the queue before then."
        )
    return (
        f"Held back for {format_duration(seconds_left)} more: a task of its type {task} snoozed "
        "holding its type (Snooze(hold_type=True)), and none of the type starts in the queue before then."
    )


def partition_limit(task: str, partition: str | None) -> Limit | None:
    """The limit a partition of a task type has now: its own if the type names it, else the
    type's for each partition; None for none."""
    limits = project_limits().partitions.get(task)
    return limits.for_partition(partition) if limits and partition is not None else None


def at_limit(use: LimitUse) -> bool:
    """Whether a scope's limits allow no start now: all its slots taken, or its bucket empty."""
    limit = use.limit
    if limit is None:
        return False
    full = limit.max_concurrency is not None and use.running >= limit.max_concurrency
    return full or (use.next_start_in or 0.0) > 0


def held_reason(task: str, use: LimitUse | None, *, partition: str | None = None) -> str:
    """Why a task of type `task` is held back, from its type's limit and use in its queue, or
    those of its partition."""
    whose = f"its partition {partition} of {task}" if partition is not None else f"its type {task}"
    if use is None or use.limit is None:
        return (
            f"Held back by a limit {whose} no longer has (the limits changed since): "
            "the next claim from the queue lets it run."
        )
    limit, now = use.limit, []
    if limit.max_concurrency is not None:
        now.append(f"{use.running:,} running now")
    wait = use.next_start_in or 0.0
    if wait > 0:
        now.append(f"next start allowed in {format_duration(wait)}")
    now.append(
        f"{plural(use.held, 'task')} of {'its partition' if partition is not None else 'its type'} held back"
    )
    then = (
        "" if at_limit(use) else " Its limits allow a start now: the next claim from the queue lets it run."
    )
    return f"Held back by the limits of {whose} ({limit.describe()}): {', '.join(now)}.{then}"


def _queue_of(task: str | None) -> str | None:
    """The queue a registered task type's tasks go to unless sent elsewhere; None if unknown."""
    task_type = get_task_type(task) if task else None
    return (task_type.options.get("queue") or get_settings().DEFAULT_QUEUE) if task_type else None


def _by_queue(refs: Sequence[TaskRef]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for ref in refs:
        grouped.setdefault(ref.queue, []).append(ref.id)
    return grouped


def _not_found(task_id: str, queue: str | None) -> str:
    return f"No task with id {task_id!r}" + (f" in queue {queue!r}." if queue else ".")

"""Manual actions on tasks by id: run now (its arguments edited, maybe), archive, delete, cancel, in
the states ACTION_STATES allows.

The scripts receive the allowed states from `ACTION_STATES` and skip tasks in any other, so a
task that moved meanwhile is left alone. No Django here: django_rtq.operations adds the
permissions and the lookups every surface needs, and the workflow commander archives the
children of a failed workflow through `archive` too.
"""

from __future__ import annotations

import json
from typing import Any

from .broker import Broker
from .errors import translate_errors
from .message import TaskMessage
from .states import ACTION_STATES, EDIT_STATES, Action, TaskState
from .workflow import WORKFLOW_TASKS, cancel_workflow

#: The error type of a task or workflow archived, deleted or cancelled by hand.
CANCELLED = "django_rtq.exceptions.TaskCancelled"
#: The reasons recorded in the info of tasks ended by hand (their error, in the ORM mirror too).
ARCHIVED_BY_HAND = "archived by hand"
DELETED_BY_HAND = "deleted by hand"
CANCELLED_BY_HAND = "cancelled"


def run_now(
    broker: Broker, queue: str, task_ids: list[str], *, only_task: str = "", only_error: str = ""
) -> int:
    """Move tasks to pending; return how many moved. Workflows are skipped (see run_now.lua),
    and so are tasks not of the type `only_task` or whose last error is not of the class
    `only_error`, when given (a dotted path, as the info's `error_type`)."""
    return _run_now(broker, queue, task_ids, [only_task, only_error, "", ""])


def edit_and_run(broker: Broker, queue: str, task_id: str, before: str, edited: TaskMessage) -> bool:
    """Replace a task's stored message, read as `before`, by `edited` (its arguments changed)
    and move it to pending, in one step; False (nothing changed) if it is no longer in a state
    run now applies to, or its message is no longer `before`."""
    return bool(_run_now(broker, queue, [task_id], ["", "", before, edited.to_json()], EDIT_STATES))


def _run_now(
    broker: Broker,
    queue: str,
    task_ids: list[str],
    narrowing: list[str],
    states: tuple[TaskState, ...] | None = None,
) -> int:
    if not task_ids:
        return 0
    if states is None:  # read at call time: ACTION_STATES is the one table
        states = ACTION_STATES[Action.RUN]
    qk = broker.queue(queue)
    state_keys = [qk.state_set(state) for state in states]
    state_args = [len(states), *states]
    keys = [qk.state, qk.priority, qk.pending, qk.seq, qk.msg, qk.info, qk.lanes, qk.vclock, *state_keys]
    return broker.run_script("run_now", keys, [qk.wake_channel, *narrowing, *state_args, *task_ids])


def archive(
    broker: Broker,
    queue: str,
    task_ids: list[str],
    *,
    reason: str = ARCHIVED_BY_HAND,
    error_type: str = CANCELLED,
) -> int:
    """Archive tasks; return how many moved.

    `reason` is recorded as their error (of `error_type`, a class path: `TaskCancelled` unless
    told); each one's record goes to the ORM mirror (when mirroring), and a workflow's child
    fails its workflow.
    """
    if not task_ids:
        return 0
    qk = broker.queue(queue)
    state_args, state_keys = _state_args(broker, queue, Action.ARCHIVE)
    keys = [
        qk.state, qk.archived, qk.msg, qk.commands, qk.command, qk.info, qk.progress, qk.finished,
        *state_keys,
    ]  # fmt: skip
    args = [broker.now_ms(), int(broker.mirror), error_type, reason, *state_args]
    args += _with_unique_keys(broker, queue, task_ids, keys)
    return broker.run_script("archive", keys, args)


def delete(broker: Broker, queue: str, task_ids: list[str]) -> int:
    """Delete tasks; return how many were deleted.

    A waiting workflow is cancelled first (its children that have not started are archived,
    its own workflow fails). A task that had not finished ends as one archived by hand would,
    with the reason "deleted by hand": its record goes to the ORM mirror (when mirroring), and a
    workflow's child fails its workflow. Then it is gone.
    """
    if not task_ids:
        return 0
    qk = broker.queue(queue)
    with translate_errors():
        current = broker.client.hmget(qk.state, task_ids)
    for task_id, state in zip(task_ids, current, strict=True):
        if state == TaskState.WAITING:
            cancel_workflow(broker, queue, task_id, error_type=CANCELLED, message=DELETED_BY_HAND)
    state_args, state_keys = _state_args(broker, queue, Action.DELETE)
    keys = [
        qk.msg, qk.state, qk.info, qk.result, qk.priority, qk.archived, qk.progress, qk.runs,
        qk.finished, qk.commands, qk.command, *state_keys,
    ]  # fmt: skip
    args = [broker.now_ms(), int(broker.mirror), CANCELLED, DELETED_BY_HAND, *state_args]
    args += _with_unique_keys(broker, queue, task_ids, keys)
    return broker.run_script("delete", keys, args)


def cancel(broker: Broker, queue: str, task_id: str, state: TaskState) -> int:
    """Stop a task: a waiting workflow is archived as cancelled at once (returns 1, or 0 if it
    had already ended); a running task is asked to stop (returns the listeners reached)."""
    if state == TaskState.WAITING:
        return int(cancel_workflow(broker, queue, task_id, error_type=CANCELLED, message=CANCELLED_BY_HAND))
    return broker.request_cancel(task_id)


def workflow_ids(broker: Broker, queue: str, task_ids: list[str]) -> set[str]:
    """The ids, among these, of workflows (see WORKFLOW_TASKS)."""
    if not task_ids:
        return set()
    with translate_errors():
        raws = broker.client.hmget(broker.queue(queue).msg, task_ids)
    found = set()
    for task_id, raw in zip(task_ids, raws, strict=True):
        try:
            name = json.loads(raw).get("task") if raw else None
        except (ValueError, AttributeError):
            name = None
        if name in WORKFLOW_TASKS:
            found.add(task_id)
    return found


def matching(broker: Broker, queue: str, task_ids: list[str], task_name: str, error_class: str) -> set[str]:
    """The ids, among these, of tasks of the type `task_name` whose last error is of the class
    `error_class` (either "" for any), as stored now; run_now.lua checks again as it moves them."""
    if not task_ids:
        return set()
    qk = broker.queue(queue)
    with translate_errors():
        pipe = broker.client.pipeline(transaction=False)
        pipe.hmget(qk.msg, task_ids)
        pipe.hmget(qk.info, task_ids)
        messages, infos = pipe.execute()
    return {
        task_id
        for task_id, message, info in zip(task_ids, messages, infos, strict=True)
        if (not task_name or _field(message, "task") == task_name)
        and (not error_class or _field(info, "error_type") == error_class)
    }


#: Tasks read per round trip when counting those a narrowed run would find.
MATCH_PAGE = 1000


def count_matching(broker: Broker, queue: str, state: TaskState, task_name: str, error_class: str) -> int:
    """How many tasks of a state `matching` finds now, a page of MATCH_PAGE at a time."""
    key = broker.queue(queue).state_set(state)
    found, offset = 0, 0
    while True:
        with translate_errors():
            ids = broker.client.zrange(key, offset, offset + MATCH_PAGE - 1)
        if not ids:
            return found
        found += len(matching(broker, queue, ids, task_name, error_class))
        offset += len(ids)


def _field(raw: str | None, name: str) -> Any:
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        return None
    return decoded.get(name) if isinstance(decoded, dict) else None


def _state_args(broker: Broker, queue: str, action: Action) -> tuple[list[Any], list[str]]:
    """The allowed states of an action as the scripts take them: a count and the names (ARGV),
    and their sorted sets (KEYS). A waiting workflow is cancelled, so archived, before it is
    deleted: the scripts never touch the waiting set themselves."""
    states = [state for state in ACTION_STATES[action] if state != TaskState.WAITING]
    return [len(states), *states], [broker.queue(queue).state_set(state) for state in states]


def _with_unique_keys(broker: Broker, queue: str, task_ids: list[str], keys: list[str]) -> list[Any]:
    """Append each task's uniqueness lock to `keys`; return the (id, key index) arguments."""
    qk = broker.queue(queue)
    with translate_errors():
        raws = broker.client.hmget(qk.msg, task_ids)
    args: list[Any] = []
    for task_id, raw in zip(task_ids, raws, strict=True):
        index = 0
        try:
            unique_key = TaskMessage.from_json(raw, id=task_id, queue=queue).unique_key if raw else None
        except ValueError:
            unique_key = None
        if unique_key:
            keys.append(qk.unique(unique_key))
            index = len(keys)
        args += [task_id, index]
    return args

"""The broker's side of workflows: their scripts, called with their keys; no planning here.

Each function touches one queue's slot. What crosses queues goes through commands: written
by a script in one slot, taken by a worker (`take_commands`), applied to another slot by a
script that records the command id (so a second application changes nothing), then removed
from the first (`commands_done`). See django_rtq/workflows/ for what the commands mean.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

import redis

from .broker import Broker
from .errors import translate_errors
from .message import MAX_ID_LENGTH
from .versions import WORKFLOW_FORMAT, NewerFormat

logger = logging.getLogger(__name__)

#: The task name of each kind of workflow (a workflow is a task of its queue in the `waiting`
#: state; see django_rtq/workflows/planner.py). None is a runnable task type: a finished
#: workflow is never moved to pending. `WORKFLOW_TASKS` in lua/_lib.lua lists the same names.
WORKFLOW_TASK = {kind: f"django_rtq.{kind}" for kind in ("chain", "group", "map_reduce", "map", "iterator")}
WORKFLOW_TASKS = frozenset(WORKFLOW_TASK.values())
#: How long (ms) a slot remembers the commands it applied: far longer than a command waits
#: between its application and its removal from its source.
APPLIED_TTL_MS = 3600 * 1000
#: How long (ms) a taken command is left to its worker before another may apply it.
COMMAND_LEASE_MS = 30 * 1000
#: How many characters of its workflow's id a child's id keeps when it is derived (child_id).
CHILD_ID_KEPT = 200
#: How a workflow script refuses a workflow whose hash is of a newer format (see _lib.lua).
_NEWER_REPLY = "NEWERFORMAT workflow "


class NewerWorkflow(NewerFormat):
    """A workflow whose hash is of a format newer than this release reads: a script refused to
    change it (nothing was), leaving it to a worker of a newer release."""

    def __init__(self, queue: str, workflow_id: str, version: int, readable: int) -> None:
        self.queue = queue
        self.workflow_id = workflow_id
        super().__init__("workflow", version, readable)


def child_id(workflow_id: str, position: int | str) -> str:
    """The id of a workflow's child at `position`: "<workflow id>.<position>", or, when that is
    longer than a task id may be, the first CHILD_ID_KEPT characters of the workflow's id, "~"
    and the SHA-1 of the long one. Ids stay within MAX_ID_LENGTH however deep workflows nest,
    and never change for those that fit (ids are derived, never stored). child_id in
    lua/_lib.lua derives the same."""
    long_id = f"{workflow_id}.{position}"
    if len(long_id) <= MAX_ID_LENGTH:
        return long_id
    return f"{workflow_id[:CHILD_ID_KEPT]}~{hashlib.sha1(long_id.encode()).hexdigest()}"


def take_commands(
    broker: Broker, queue: str, *, limit: int = 100, lease_ms: int = COMMAND_LEASE_MS
) -> list[tuple[str, str]]:
    """Lease and return up to `limit` due commands of a queue, as (id, JSON) pairs."""
    qk = broker.queue(queue)
    reply = broker.run_script("take_commands", [qk.commands, qk.command], [broker.now_ms(), lease_ms, limit])
    return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]


def commands_done(broker: Broker, queue: str, commands: Sequence[tuple[str, str]]) -> int:
    """Remove applied commands, each only if unchanged since taken."""
    if not commands:
        return 0
    qk = broker.queue(queue)
    args: list[str] = []
    for cmd_id, body in commands:
        args += [cmd_id, hashlib.sha1(body.encode()).hexdigest()]
    return broker.run_script("commands_done", [qk.commands, qk.command], args)


def activate(
    broker: Broker,
    queue: str,
    *,
    cmd_id: str,
    tasks: Sequence[list[Any]] = (),
    workflows: Sequence[dict[str, Any]] = (),
) -> int:
    """Enqueue tasks ([id, message JSON, priority, process-at ms]) and create workflows
    ({"id", "msg", "fields": {...}, "commands": [[id, JSON(, due ms)], ...]}) in a queue, once
    per `cmd_id` ("" to rely on the ids alone). Returns how many were written."""
    qk = broker.queue(queue)
    keys = [
        qk.msg, qk.state, qk.priority, qk.pending, qk.scheduled, qk.seq, qk.active, qk.owner,
        qk.idle, qk.paused, qk.applied, qk.state_set("waiting"), qk.commands, qk.command, qk.runs,
        qk.holds, qk.lanes, qk.vclock,
    ]  # fmt: skip
    planned = []
    for workflow in workflows:
        keys.append(qk.workflow(workflow["id"]))
        fields = [str(part) for item in workflow["fields"].items() for part in item]
        planned.append({**workflow, "key": len(keys), "fields": fields})
    plan = json.dumps({"tasks": list(tasks), "workflows": planned}, separators=(",", ":"))
    broker.register_queues([queue])
    args = [
        broker.now_ms(),
        qk.wake_channel,
        broker.handoff_prefix(qk, (json.loads(task[1]).get("task", "") for task in tasks)),
        broker.lease_ms,
        cmd_id,
        APPLIED_TTL_MS,
        plan,
    ]
    return broker.run_script("activate", keys, args)


def newer_workflows(broker: Broker, queue: str, workflow_ids: Sequence[str]) -> set[str]:
    """Those of the workflows whose hash is of a format newer than this release reads (their
    scripts refuse them: a worker of a newer release is to change them)."""
    if not workflow_ids:
        return set()
    with translate_errors():
        pipe = broker.client.pipeline(transaction=False)
        for workflow_id in workflow_ids:
            pipe.hget(broker.queue(queue).workflow(workflow_id), "v")
        versions = pipe.execute()
    return {
        workflow_id
        for workflow_id, version in zip(workflow_ids, versions, strict=True)
        if version is not None and (not version.isdigit() or int(version) > WORKFLOW_FORMAT)
    }


def _workflow_keys(broker: Broker, queue: str, workflow_id: str) -> list[str]:
    qk = broker.queue(queue)
    return [
        qk.workflow(workflow_id), qk.workflow_results(workflow_id), qk.applied, qk.commands,
        qk.command, qk.msg, qk.state, qk.state_set("waiting"), qk.completed, qk.archived,
        qk.info, qk.result, qk.finished, qk.priority, qk.progress, qk.runs,
    ]  # fmt: skip


def _run_on_workflow(broker: Broker, name: str, queue: str, workflow_id: str, args: Sequence[Any]) -> Any:
    """Run a script that changes a waiting workflow (see workflow_context in _lib.lua); raise
    NewerWorkflow when it refused one of a newer format."""
    try:
        return broker.run_script(name, _workflow_keys(broker, queue, workflow_id), args)
    except redis.ResponseError as exc:
        refusal = str(exc)
        if not refusal.startswith(_NEWER_REPLY):
            raise
        version, readable = (int(part) for part in refusal.removeprefix(_NEWER_REPLY).split()[:2])
        raise NewerWorkflow(queue, workflow_id, version, readable) from None


def child_outcome(
    broker: Broker,
    queue: str,
    workflow_id: str,
    *,
    cmd_id: str,
    position: int | str,
    ok: bool,
    payload_json: str,
    iterator_state_json: str = "",
    exhausted: bool = False,
    new_children: Sequence[tuple[str, str]] = (),
) -> str:
    """Apply a child's outcome (its result JSON, or its error JSON) to its workflow, once.

    An iterator's step also passes the iterator's new state and its new children as
    (queue, node JSON) pairs. Returns what happened: dup, gone, failed, finished or recorded;
    or corrupt: the workflow's own state in Redis was, and it is archived (logged here).
    Raise NewerWorkflow, having changed nothing, for a workflow of a newer format.
    """
    args: list[Any] = [
        broker.now_ms(), workflow_id, int(broker.mirror), cmd_id, APPLIED_TTL_MS, position,
        int(ok), payload_json, iterator_state_json, int(exhausted), queue,
    ]  # fmt: skip
    for child_queue, node_json in new_children:
        args += [child_queue, node_json]
    reply = _run_on_workflow(broker, "child_outcome", queue, workflow_id, args)
    return _reply(reply, queue, workflow_id)


def cancel_workflow(broker: Broker, queue: str, workflow_id: str, *, error_type: str, message: str) -> bool:
    """Archive a waiting workflow as failed with this error, and cancel its unfinished children.
    Raise NewerWorkflow, having changed nothing, for a workflow of a newer format."""
    args = [broker.now_ms(), workflow_id, int(broker.mirror), error_type, message]
    return _run_on_workflow(broker, "cancel_workflow", queue, workflow_id, args) == 1


def start_postponed(broker: Broker, queue: str, workflow_id: str, *, cmd_id: str) -> bool:
    """Start a postponed workflow (its start command is due), once per `cmd_id`: its stage
    moves on and its first children's activations are written. False if it was not postponed,
    or if its state in Redis was corrupt (it is then archived, and that is logged here). Raise
    NewerWorkflow, having changed nothing, for a workflow of a newer format."""
    args = [broker.now_ms(), workflow_id, int(broker.mirror), cmd_id, APPLIED_TTL_MS]
    reply = _run_on_workflow(broker, "start_postponed", queue, workflow_id, args)
    return _reply(reply, queue, workflow_id) == 1


def _reply(reply: Any, queue: str, workflow_id: str) -> Any:
    """A workflow script's reply; ["corrupt", error] (the script found the workflow's own state
    corrupt and archived it, with that error) is logged and becomes "corrupt"."""
    if isinstance(reply, list) and reply and reply[0] == "corrupt":
        logger.error("workflow %r of queue %r archived: %s", workflow_id, queue, reply[1])
        return "corrupt"
    return reply


def defer_command(broker: Broker, queue: str, cmd_id: str, due_ms: int) -> None:
    """Make a taken command due again at `due_ms` (sooner or later than its lease ends), if
    it is still there."""
    with translate_errors():
        # XX: a command removed meanwhile (applied by another worker) is not written back. One
        # rewritten meanwhile (a child run again) is put off too: it is applied later, as it is.
        broker.client.zadd(broker.queue(queue).commands, {cmd_id: due_ms}, xx=True)


def set_progress(broker: Broker, queue: str, task_id: str, done: float, total: float | None) -> None:
    """Record a running task's progress."""
    value = json.dumps({"done": done, "total": total}, separators=(",", ":"))
    broker.client.hset(broker.queue(queue).progress, task_id, value)

"""Starting workflows and applying their commands (DESIGN.md principle 3, seed 001).

Four commands exist, each written atomically in one queue's slot and applied to another (or,
for start, to the same one later):

- activate: start a workflow's children (plan them, then enqueue or create them in their
  queues); written by the workflow's slot; applied once per target queue.
- child: a child finished (result) or failed for good (error); written by the child's slot
  in the same script that settled it; applied once to its workflow's slot.
- cancel: archive a failed or cancelled workflow's children that have not started.
- start: a postponed workflow's time has come; written, due then, by the script that created
  it; applied once to its own slot, where it writes the workflow's first activations.

A command is removed from its source only after it was applied, and each application is
recorded in the target slot, so a worker killed at any point leaves a command that another
applies later with the effect of once.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any, Protocol

from ..broker import Broker, manual
from ..broker.attempt import error_path
from ..broker.states import TaskState
from ..broker.workflow import (
    NewerWorkflow,
    activate,
    cancel_workflow,
    child_id,
    child_outcome,
    commands_done,
    defer_command,
    start_postponed,
    take_commands,
)
from ..connection import get_broker
from ..exceptions import BrokerUnavailable, InvalidTask, TaskIdConflict
from ..task_options import TASK_ID_PATTERN, TASK_ID_RULE
from ..tracing import sending_workflow
from .planner import NO_INPUT, EmptyGroup, ParentRef, dumps, plan

logger = logging.getLogger(__name__)

#: Commands taken per script call.
TAKE_LIMIT = 100
#: Workflows of a newer format remembered as already logged (the oldest are forgotten first).
NEWER_LOGGED_LIMIT = 10_000


class RetryPolicy(Protocol):
    """What to do with a command that could not be applied (an error other than Redis being
    unavailable): `failed` returns the seconds to wait before trying it again, or None to
    give it up (it is then removed, unapplied)."""

    def failed(self, queue: str, cmd_id: str, body: str, error: Exception) -> float | None: ...


def start_workflow(
    node: dict[str, Any], *, queue: str | None, workflow_id: str, broker: Broker | None = None
) -> str:
    """Create a workflow from its node and start its first children; return its id."""
    if not isinstance(workflow_id, str) or not TASK_ID_PATTERN.fullmatch(workflow_id):
        raise InvalidTask(f"workflow_id must be {TASK_ID_RULE}, not {workflow_id!r}.")
    broker = broker or get_broker()
    if queue:
        node = {**node, "queue": queue}
    with sending_workflow(node, workflow_id) as node:
        planned = plan(node, node_id=workflow_id, parent=None)
        if not activate(broker, planned.queue, cmd_id="", workflows=[planned.workflow]):
            raise TaskIdConflict(f"A task with id {workflow_id!r} already exists in queue {planned.queue!r}.")
        try:
            apply_due(broker, [planned.queue])
        except BrokerUnavailable as exc:  # a worker's commander starts them instead
            logger.warning("workflow %r created; its first steps wait for a worker (%s)", workflow_id, exc)
    return workflow_id


def apply_due(
    broker: Broker, queues: list[str], *, follow: bool = True, retry: RetryPolicy | None = None
) -> int:
    """Apply the due commands of these queues; with `follow`, also those that applying them
    wrote in other queues (a child's result starts the next step there). Returns how many.

    A command that cannot be applied is logged and left leased, to be tried again once its
    lease ends; or, with a `retry` policy, when and as often as that says. A command for a
    workflow of a newer format (NewerWorkflow) is left leased, whatever the policy: a worker
    of a newer release applies it (this one takes it again only once its lease ends)."""
    applied = 0
    todo = list(dict.fromkeys(queues))
    while todo:
        queue = todo.pop(0)
        while taken := take_commands(broker, queue, limit=TAKE_LIMIT):
            done, given_up, touched = [], [], set()
            for cmd_id, body in taken:
                try:
                    touched |= apply_command(broker, cmd_id, json.loads(body))
                except BrokerUnavailable:
                    raise
                except NewerWorkflow as exc:
                    _left_for_newer(queue, cmd_id, exc)
                    continue
                except Exception as exc:
                    logger.exception("could not apply command %r of queue %r", cmd_id, queue)
                    if retry is None:
                        continue  # left leased: tried again once its lease ends
                    delay = retry.failed(queue, cmd_id, body, exc)
                    if delay is None:
                        given_up.append((cmd_id, body))
                    else:
                        defer_command(broker, queue, cmd_id, broker.now_ms() + int(delay * 1000))
                    continue
                done.append((cmd_id, body))
            commands_done(broker, queue, done + given_up)
            applied += len(done)
            if follow:
                todo += [q for q in touched if q != queue and q not in todo]
            if not done and not given_up:
                break  # only commands that failed: their lease (or delay) keeps them until later
    return applied


#: (queue, id) of the workflows of a newer format this process has logged, oldest first.
_newer_logged: dict[tuple[str, str], None] = {}


def _left_for_newer(queue: str, cmd_id: str, refusal: NewerWorkflow) -> None:
    """Log, once per workflow, that its commands are left for a worker of a newer release."""
    workflow = (refusal.queue, refusal.workflow_id)
    if workflow in _newer_logged:
        return
    if len(_newer_logged) >= NEWER_LOGGED_LIMIT:
        del _newer_logged[next(iter(_newer_logged))]
    _newer_logged[workflow] = None
    logger.warning(
        "command %r of queue %r left for a newer worker: workflow %r of queue %r: %s",
        cmd_id, queue, refusal.workflow_id, refusal.queue, refusal,
    )  # fmt: skip


def apply_command(broker: Broker, cmd_id: str, command: dict[str, Any]) -> set[str]:
    """Apply one command; return the queues it wrote to."""
    kind = command.get("type")
    if kind == "activate":
        return _activate(broker, cmd_id, command)
    if kind == "child":
        return _child(broker, cmd_id, command)
    if kind == "cancel":
        return _cancel(broker, command)
    if kind == "start":
        start_postponed(broker, command["queue"], command["workflow"], cmd_id=cmd_id)
        return {command["queue"]}
    logger.error("dropping command %r of unknown type %r", cmd_id, kind)
    return set()


#: The fields naming the queue and the id of the workflow a command is for, by type.
_WORKFLOW_FIELDS = {
    "child": ("to_queue", "to"),
    "activate": ("parent_queue", "parent"),
    "start": ("queue", "workflow"),
}


def workflow_of(queue: str, cmd_id: str, body: str) -> tuple[str, str] | None:
    """The queue and id of the workflow a command of `queue` is for (a child's outcome, an
    activation of its children, its start), as far as the command tells; None for a cancel
    (its workflow is gone) or a command that says nothing usable."""
    try:
        command = json.loads(body)
    except ValueError:
        command = None
    if isinstance(command, dict):
        kind = command.get("type")
        fields = _WORKFLOW_FIELDS.get(kind) if isinstance(kind, str) else None
        if fields and all(isinstance(command.get(name), str) for name in fields):
            return command[fields[0]], command[fields[1]]
    # Activations and starts are written in their workflow's own queue, under its id.
    if cmd_id.startswith("start:"):
        return queue, cmd_id.removeprefix("start:")
    if cmd_id.startswith("activate:") and cmd_id.count(":") >= 3:
        return queue, cmd_id.removeprefix("activate:").rsplit(":", 2)[0]
    return None


def _activate(broker: Broker, cmd_id: str, command: dict[str, Any]) -> set[str]:
    parent = ParentRef(command["parent"], command["parent_queue"], 0)
    tasks: dict[str, list[Any]] = defaultdict(list)
    workflows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    outcomes: list[tuple[int | str, bool, str]] = []  # children settled without running
    for item in command["items"]:
        position = item["pos"]
        child = ParentRef(parent.id, parent.queue, position)
        try:
            planned = plan(
                item["node"],
                node_id=child_id(parent.id, position),
                parent=child,
                input=item.get("input", NO_INPUT),
            )
        except EmptyGroup:
            outcomes.append((position, True, "[]"))
            continue
        except Exception as exc:  # a step that cannot run fails like a child that failed
            logger.warning(
                "child %s.%s of workflow %r cannot run (%s: %s); it fails", parent.id, position, parent.id,
                error_path(exc), exc,
            )  # fmt: skip
            error = {"type": error_path(exc), "message": str(exc), "traceback": ""}
            outcomes.append((position, False, dumps(error)))
            continue
        if planned.task is not None:
            tasks[planned.queue].append(planned.task)
        else:
            workflows[planned.queue].append(planned.workflow)
    touched = set()
    for queue in dict.fromkeys([*tasks, *workflows]):
        activate(broker, queue, cmd_id=f"{cmd_id}@{queue}", tasks=tasks[queue], workflows=workflows[queue])
        touched.add(queue)
    for position, ok, payload in outcomes:
        child_outcome(
            broker,
            parent.queue,
            parent.id,
            cmd_id=f"{cmd_id}:settled:{position}",
            position=position,
            ok=ok,
            payload_json=payload,
        )
        touched.add(parent.queue)
    return touched


def _child(broker: Broker, cmd_id: str, command: dict[str, Any]) -> set[str]:
    queue, workflow_id, position, ok = command["to_queue"], command["to"], command["pos"], command["ok"]
    iterator: dict[str, Any] = {}
    if ok and isinstance(position, str) and position.startswith("d"):  # an iterator's step
        step = command.get("result") or {}
        children = step.get("children") or []
        iterator = {
            "iterator_state_json": dumps(step.get("state")),
            "exhausted": bool(step.get("done")) or not children,
            "new_children": [(child["queue"], dumps(child)) for child in children],
        }
    payload = command.get("result") if ok else command.get("error") or {}
    child_outcome(
        broker,
        queue,
        workflow_id,
        cmd_id=cmd_id,
        position=position,
        ok=ok,
        payload_json=dumps(payload),
        **iterator,
    )
    return {queue}


def _cancel(broker: Broker, command: dict[str, Any]) -> set[str]:
    """Archive children that have not started; cancel children that are workflows themselves.
    Running children are left to finish: their outcome no longer changes anything."""
    reason = f"its workflow {command['workflow']!r} failed or was cancelled"
    for queue, ids in command["children"].items():
        states = broker.client.hmget(broker.queue(queue).state, ids)
        for task_id, state in zip(ids, states, strict=True):
            if state == TaskState.WAITING:
                cancel_workflow(broker, queue, task_id, error_type=manual.CANCELLED, message=reason)
        not_started = [i for i, s in zip(ids, states, strict=True) if s in _NOT_STARTED]
        manual.archive(broker, queue, not_started, reason=reason)
    return set(command["children"])


_NOT_STARTED = (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY)

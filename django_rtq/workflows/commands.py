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
from typing import Any

from ..broker import Broker
from ..broker.inspect import CANCELLED, Inspector
from ..broker.states import TaskState
from ..broker.workflow import (
    activate,
    cancel_workflow,
    child_outcome,
    commands_done,
    start_postponed,
    take_commands,
)
from ..connection import get_broker
from ..exceptions import BrokerUnavailable, TaskIdConflict
from .planner import NO_INPUT, EmptyGroup, ParentRef, dumps, plan

logger = logging.getLogger(__name__)

#: Commands taken per script call.
TAKE_LIMIT = 100


def start_workflow(
    node: dict[str, Any], *, queue: str | None, workflow_id: str, broker: Broker | None = None
) -> str:
    """Create a workflow from its node and start its first children; return its id."""
    broker = broker or get_broker()
    if queue:
        node = {**node, "queue": queue}
    planned = plan(node, node_id=workflow_id, parent=None)
    if not activate(broker, planned.queue, cmd_id="", workflows=[planned.workflow]):
        raise TaskIdConflict(f"A task with id {workflow_id!r} already exists in queue {planned.queue!r}.")
    try:
        apply_due(broker, [planned.queue])
    except BrokerUnavailable as exc:  # a worker's commander starts them instead
        logger.warning("workflow %r created; its first steps wait for a worker (%s)", workflow_id, exc)
    return workflow_id


def apply_due(broker: Broker, queues: list[str], *, follow: bool = True) -> int:
    """Apply the due commands of these queues; with `follow`, also those that applying them
    wrote in other queues (a child's result starts the next step there). Returns how many."""
    applied = 0
    todo = list(dict.fromkeys(queues))
    while todo:
        queue = todo.pop(0)
        while taken := take_commands(broker, queue, limit=TAKE_LIMIT):
            done, touched = [], set()
            for cmd_id, body in taken:
                try:
                    touched |= apply_command(broker, cmd_id, json.loads(body))
                except BrokerUnavailable:
                    raise
                except Exception:
                    # Left leased: tried again once its lease ends.
                    logger.exception("could not apply command %r of queue %r", cmd_id, queue)
                    continue
                done.append((cmd_id, body))
            commands_done(broker, queue, done)
            applied += len(done)
            if follow:
                todo += [q for q in touched if q != queue and q not in todo]
            if not done:
                break  # only commands that failed: their lease keeps them until later
    return applied


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
                node_id=f"{parent.id}.{position}",
                parent=child,
                input=item.get("input", NO_INPUT),
            )
        except EmptyGroup:
            outcomes.append((position, True, "[]"))
            continue
        except Exception as exc:  # a step that cannot run fails like a child that failed
            error = {"type": _class_path(exc), "message": str(exc), "traceback": ""}
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
    inspector = Inspector(broker)
    reason = f"its workflow {command['workflow']!r} failed or was cancelled"
    for queue, ids in command["children"].items():
        states = broker.client.hmget(broker.queue(queue).state, ids)
        for child_id, state in zip(ids, states, strict=True):
            if state == TaskState.WAITING:
                cancel_workflow(broker, queue, child_id, error_type=CANCELLED, message=reason)
        not_started = [i for i, s in zip(ids, states, strict=True) if s in _NOT_STARTED]
        inspector.archive(queue, not_started, reason=reason)
    return set(command["children"])


_NOT_STARTED = (TaskState.PENDING, TaskState.SCHEDULED, TaskState.RETRY)


def _class_path(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"

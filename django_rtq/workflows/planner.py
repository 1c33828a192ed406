"""Turn a node (see canvas.py) into what the activation script writes: a task's message, or a
workflow's hash fields and the commands that start its first children."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..broker.message import TaskMessage
from ..broker.workflow import WORKFLOW_TASK
from ..conf import get_settings
from ..connection import queue_time
from ..exceptions import InvalidTask
from ..message_builder import build_message
from ..registry import find_task_type
from ..tracing import node_trace

#: Children per activation command (and per activation script call).
ACTIVATION_BATCH = 500
#: The task type that runs an iterator's function (see iterate.py).
ITERATE_TASK = "django_rtq.iterate"
#: Passed as `input` when a node receives no previous result.
NO_INPUT: Any = object()


class EmptyGroup(ValueError):
    """A group (or a map step's chunks) with no children: its result is [] at once."""


@dataclass(frozen=True, slots=True)
class ParentRef:
    """Where a child reports: its workflow's id and queue, and its own position there."""

    id: str
    queue: str
    position: int | str


@dataclass(frozen=True, slots=True)
class Planned:
    """A planned node: a task (`task`, as the activation script takes it) or a workflow."""

    queue: str
    task: list[Any] | None = None  # [id, message JSON, priority, process-at ms]
    workflow: dict[str, Any] | None = None  # {"id", "msg", "fields", "commands"}


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def plan(node: dict[str, Any], *, node_id: str, parent: ParentRef | None, input: Any = NO_INPUT) -> Planned:
    """Plan a node under this id; raise InvalidTask (or ValueError) if it cannot run."""
    kind = node.get("t")
    if kind == "task":
        return _plan_task(node, node_id, parent, input)
    if kind in ("chain", "group", "each", "iterator"):
        return _plan_workflow(node, node_id, parent, input)
    raise InvalidTask(f"Unknown workflow node type {kind!r}.")


def _plan_task(node: dict[str, Any], node_id: str, parent: ParentRef | None, input: Any) -> Planned:
    task_type = find_task_type(node["task"])
    if task_type is None:
        raise InvalidTask(f"No task type is registered as {node['task']!r}.")
    args = list(node.get("args") or [])
    if input is not NO_INPUT and not node.get("immutable"):
        args.insert(0, input)
    # A step runs as its workflow says: never merged into another call (docs/debounce.md).
    options = {
        **(node.get("options") or {}),
        "task_id": node_id,
        "queue": node["queue"],
        "debounce": None,
        "debounce_key": None,
    }
    message = build_message(task_type.using(**options), args, node.get("kwargs") or {})
    if parent is not None:
        message = replace(message, parent=parent.id, parent_queue=parent.queue, position=parent.position)
    if node_trace(node):
        message = replace(message, trace=node_trace(node))
    process_at_ms = int(message.process_at * 1000) if message.process_at else 0
    return Planned(queue=message.queue, task=[message.id, message.to_json(), message.priority, process_at_ms])


def _plan_workflow(node: dict[str, Any], node_id: str, parent: ParentRef | None, input: Any) -> Planned:
    kind = node["t"]
    queue = node["queue"]
    retention = node.get("retention")
    if retention is None:
        retention = get_settings().RETENTION
    now = queue_time()  # the queue's clock (Redis's), which its delay is reckoned on
    fields: dict[str, Any] = {
        "created": int(now * 1000),
        "retention": int(float(retention) * 1000),
        "queue": queue,
        "on_error": node.get("on_error", "fail"),
        "done": 0,
    }
    if parent is not None:
        fields.update(parent=parent.id, parent_queue=parent.queue, position=parent.position)
    name = "map_reduce" if node.get("stages") else kind
    if kind == "chain":
        items = _chain(node, fields, input)
    elif kind == "iterator":
        items = _iterator(node, fields)
    else:
        items = _group(node, fields, input)
        name = "map" if kind == "each" else name
    start_at = _start_at(node, fields["created"])
    message = TaskMessage(
        id=node_id,
        task=WORKFLOW_TASK[name],
        queue=queue,
        kwargs={"size": fields.get("n")} if "n" in fields else {},
        retention=float(retention),
        enqueued_at=now,
        parent=parent.id if parent else None,
        parent_queue=parent.queue if parent else None,
        position=parent.position if parent else None,
        process_at=start_at / 1000 if start_at else None,
    )
    commands = [
        [
            f"activate:{node_id}:init:{first}",
            dumps({"type": "activate", "parent": node_id, "parent_queue": queue, "items": []})[:-2]
            + ",".join(items[first : first + ACTIVATION_BATCH])
            + "]}",
        ]
        for first in range(0, len(items), ACTIVATION_BATCH)
    ]
    if start_at:
        # Postponed: its first activations wait in its hash, and one command, due at its
        # start time, starts it (start_postponed.lua).
        fields.update(stage="postponed", start_at=start_at, start=dumps(commands))
        start = {"type": "start", "workflow": node_id, "queue": queue}
        commands = [[f"start:{node_id}", dumps(start), start_at]]
    return Planned(
        queue=queue,
        workflow={"id": node_id, "msg": message.to_json(), "fields": fields, "commands": commands},
    )


def _start_at(node: dict[str, Any], created_ms: int) -> int | None:
    """When (ms) a postponed workflow starts (see Workflow.using); None to start at once."""
    if node.get("process_at") is not None:
        start_at = int(float(node["process_at"]) * 1000)
    elif node.get("delay") is not None:
        start_at = created_ms + int(float(node["delay"]) * 1000)
    else:
        return None
    return start_at if start_at > created_ms else None


def _item(position: int | str, node: dict[str, Any] | str, input: Any) -> str:
    """An activation item as JSON: {"pos", "node"[, "input"]}; `node` a dict or its JSON."""
    node_json = node if isinstance(node, str) else dumps(node)
    item = f'{{"pos":{dumps(position)},"node":{node_json}'
    if input is not NO_INPUT:
        item += f',"input":{dumps(input)}'
    return item + "}"


def _chain(node: dict[str, Any], fields: dict[str, Any], input: Any) -> list[str]:
    fields["kind"] = "chain"
    steps = node["steps"]
    fields["n"] = len(steps)
    for position, step in enumerate(steps[1:], start=1):
        fields[f"step:{position}"] = dumps(step)
        fields[f"step_queue:{position}"] = step["queue"]
    fields["queue:0"] = steps[0]["queue"]
    for position, stage in enumerate(node.get("stages") or []):
        fields[f"stage:{position}"] = stage
    if node.get("stages"):
        fields["stage"] = node["stages"][0]
    return [_item(0, steps[0], input)]


def _group(node: dict[str, Any], fields: dict[str, Any], input: Any) -> list[str]:
    fields["kind"] = "group"
    if node["t"] == "each":
        if not isinstance(input, list):
            raise ValueError(f"A map step returns a list of chunks, not {type(input).__name__}.")
        template = dumps(node["task"])
        children: list[tuple[dict[str, Any] | str, Any]] = [(template, chunk) for chunk in input]
        queues = [node["task"]["queue"]] * len(input)
    else:
        children = [(child, input) for child in node["children"]]
        queues = [child["queue"] for child in node["children"]]
    if not children:
        raise EmptyGroup("A group needs at least one child.")
    fields["n"] = len(children)
    for position, child_queue in enumerate(queues):
        fields[f"queue:{position}"] = child_queue
    return [_item(position, child, child_input) for position, (child, child_input) in enumerate(children)]


def _iterator(node: dict[str, Any], fields: dict[str, Any]) -> list[str]:
    queue = node["queue"]
    driver_node = {
        "t": "task",
        "task": ITERATE_TASK,
        "args": [],
        "options": {},
        "immutable": True,
        "queue": queue,
    }
    if node_trace(node):
        driver_node["trace"] = node_trace(node)
    driver = dumps(driver_node)
    # The script appends the iterator's state and closes kwargs and the node: see child_outcome.lua.
    driver_prefix = driver[:-1] + ',"kwargs":{"iterator":' + dumps(node["task"]) + ',"state":'
    state = dumps(node.get("state"))
    fields.update(
        kind="iterator",
        made=0,  # children made so far
        active=0,
        exhausted=0,
        driving=1,
        steps=1,
        window=int(node["window"]),
        state=state,
        driver=driver_prefix,
        **{"queue:d0": queue},
    )
    return [_item("d0", driver_prefix + state + "}}", NO_INPUT)]

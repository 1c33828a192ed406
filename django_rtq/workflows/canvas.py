"""What users compose workflows from: signatures of task calls, chain, group, chord,
map/reduce and iterator. Each turns into a node: a JSON-able dict the planner reads."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from typing import Any, Literal, Self

from ..broker import Broker
from ..conf import get_settings
from ..connection import queue_time
from ..exceptions import InvalidTask, WorkflowTooDeep
from ..registry import Signature, TaskType
from ..task_options import as_instant, as_seconds
from .commands import start_workflow

OnError = Literal["fail", "collect"]

#: How many workflows deep one workflow may nest (a workflow of tasks is 1 deep; a chain with
#: that workflow as a step, 2). Deeper ones are refused with WorkflowTooDeep before anything is
#: written: a node is one JSON document, planned, stored and read by recursive code (Python's
#: json, Redis's cjson, nested 1,000 deep at most), and a workflow nests 2 JSON levels a level.
#: Runs end to end far deeper (see docs/workflows.md); ids do not grow past 255 characters.
MAX_DEPTH = 100


class Workflow:
    """Steps composed: a workflow has children of its own, signatures or workflows."""

    # When it starts, as its node says: {"delay": seconds from its creation} or
    # {"process_at": epoch seconds}; empty for at once. Set by `using`.
    start: dict[str, float] = {}  # never changed in place: `using` replaces it

    def using(self, *, delay: Any = None, process_at: Any = None) -> Self:
        """This workflow, postponed: it waits (state `waiting`, stage `postponed`, no child
        started) until `delay` has passed (seconds or a timedelta, from when it is created:
        enqueued, or started by its own workflow) or until `process_at` (a datetime, a
        timedelta from now, or epoch seconds), then starts its first children."""
        if delay is not None and process_at is not None:
            raise InvalidTask("Give delay or process_at, not both.")
        postponed = copy.copy(self)
        if delay is not None:
            postponed.start = {"delay": as_seconds(delay, "delay")}
        elif process_at is not None:
            postponed.start = {"process_at": as_instant(process_at, "process_at", queue_time())}
        else:
            postponed.start = {}
        return postponed

    def node(self) -> dict[str, Any]:
        """This workflow as a node (a JSON-able dict the planner reads); raise WorkflowTooDeep
        if it nests workflows deeper than MAX_DEPTH, before building anything recursively."""
        check_depth(self)
        return self._node()

    def _node(self) -> dict[str, Any]:
        raise NotImplementedError

    def _children(self) -> Sequence[Step]:
        return ()

    def enqueue(
        self, *, queue: str | None = None, workflow_id: str | None = None, broker: Broker | None = None
    ) -> str:
        """Start this workflow; return its id (its result's id)."""
        return start_workflow(
            self.node(), queue=queue, workflow_id=workflow_id or uuid.uuid4().hex, broker=broker
        )


#: What a workflow is made of: a task call, or a workflow itself.
Step = Signature | Workflow


def _nodes(children: Sequence[Step]) -> list[dict[str, Any]]:
    for child in children:
        if not isinstance(child, Step):
            raise TypeError(
                f"A workflow's children are signatures (task.s(...)) or workflows, not {child!r}."
            )
    return [child._node() if isinstance(child, Workflow) else child.node() for child in children]


def check_depth(workflow: Workflow) -> int:
    """How many workflows deep `workflow` nests; raise WorkflowTooDeep past MAX_DEPTH.

    Without recursion, one level at a time, each workflow object counted once per level (a
    sub-workflow shared by many steps costs once), so a canvas nested 100,000 deep is refused
    as cheaply as measured: a level with no workflows ends it. One that contains itself (a
    cycle made by changing its steps) would never end: it is caught once the levels outnumber
    the workflow objects seen."""
    level: dict[int, Workflow] = {id(workflow): workflow}
    seen = set(level)
    depth = 0
    while level:
        depth += 1
        if depth > len(seen):
            raise WorkflowTooDeep(None, MAX_DEPTH)
        level = {
            id(child): child
            for parent in level.values()
            for child in parent._children()
            if isinstance(child, Workflow)
        }
        seen.update(level)
    if depth > MAX_DEPTH:
        raise WorkflowTooDeep(depth, MAX_DEPTH)
    return depth


def _queue(queue: str | None, nodes: list[dict[str, Any]]) -> str:
    return queue or (nodes[0]["queue"] if nodes else get_settings().DEFAULT_QUEUE)


def _check_on_error(on_error: str) -> None:
    if on_error not in ("fail", "collect"):
        raise ValueError(f"on_error is 'fail' or 'collect', not {on_error!r}.")


class chain(Workflow):
    """Steps run one after another; each receives the previous one's result (unless made with
    `.si()`); the chain's result is the last step's."""

    kind = "chain"

    def __init__(self, *steps: Step, queue: str | None = None, retention: float | None = None) -> None:
        if not steps:
            raise ValueError("A chain needs at least one step.")
        self.steps = steps
        self.queue = queue
        self.retention = retention
        self.stages: list[str] | None = None

    def _children(self) -> Sequence[Step]:
        return self.steps

    def _node(self) -> dict[str, Any]:
        steps = _nodes(self.steps)
        node = {
            "t": "chain",
            "steps": steps,
            "queue": _queue(self.queue, steps),
            "retention": self.retention,
            **self.start,
        }
        if self.stages:
            node["stages"] = self.stages
        return node


class group(Workflow):
    """Children run in parallel; the group's result is the list of theirs, in order.

    A child that fails for good fails the group (and cancels the children that have not
    started), unless `on_error="collect"`: then its place in the result is `{"error": {...}}`.
    """

    def __init__(
        self,
        *children: Step,
        on_error: OnError = "fail",
        queue: str | None = None,
        retention: float | None = None,
    ) -> None:
        _check_on_error(on_error)
        if len(children) == 1 and not isinstance(children[0], Step):
            children = tuple(children[0])  # group(sig for ...) as well as group(a, b)
        self.children = children
        self.on_error = on_error
        self.queue = queue
        self.retention = retention

    def _children(self) -> Sequence[Step]:
        return self.children

    def _node(self) -> dict[str, Any]:
        children = _nodes(self.children)
        return {
            "t": "group",
            "children": children,
            "on_error": self.on_error,
            "queue": _queue(self.queue, children),
            "retention": self.retention,
            **self.start,
        }


def chord(header: group | Sequence[Step], callback: Step, **options: Any) -> chain:
    """A group, then `callback` with the list of its results."""
    if not isinstance(header, group):
        header = group(*header)
    return chain(header, callback, **options)


class _each(Workflow):
    """One child per item of its input (a list), each a call of `task` with the item first."""

    def __init__(self, task: Signature, on_error: OnError, queue: str | None) -> None:
        self.task = task
        self.on_error = on_error
        self.queue = queue

    def _node(self) -> dict[str, Any]:
        template = self.task.node()
        return {
            "t": "each",
            "task": template,
            "on_error": self.on_error,
            "queue": self.queue or template["queue"],
        }


def map_reduce(
    map: Signature,
    process: Signature,
    reduce: Signature,
    *,
    on_error: OnError = "fail",
    queue: str | None = None,
    retention: float | None = None,
) -> chain:
    """Seed 000's map/reduce: `map` returns a list of chunks; each chunk runs as a call of
    `process` (chunk first), in parallel, with its own retries; `reduce` receives the list of
    their results. The workflow's stage reads mapping, aggregating, then reducing (and first
    postponed, until its time, when made with `.using(delay=...)` or `process_at=`)."""
    _check_on_error(on_error)
    workflow = chain(map, _each(process, on_error, queue), reduce, queue=queue, retention=retention)
    workflow.stages = ["mapping", "aggregating", "reducing"]
    return workflow


class iterator(Workflow):
    """Seed 001's iterator: children made lazily, `window` at most running at a time.

    `task` is a task type called as `task(state)` by a worker; it returns `(new_state,
    [signatures...])` for the next children, or None (or no children) once there are no
    more. It is called again, with the state it returned, whenever half the window is free.
    The iterator's result is the number of children that ran.
    """

    def __init__(
        self,
        task: TaskType,
        state: Any = None,
        *,
        window: int = 100,
        queue: str | None = None,
        retention: float | None = None,
    ) -> None:
        if not isinstance(task, TaskType):
            raise TypeError(f"iterator() takes a task type (a function decorated with @task), not {task!r}.")
        if window < 1:
            raise ValueError("An iterator's window is at least 1.")
        self.task = task
        self.state = state
        self.window = window
        self.queue = queue
        self.retention = retention

    def _node(self) -> dict[str, Any]:
        queue = self.queue or self.task.options.get("queue") or get_settings().DEFAULT_QUEUE
        return {
            "t": "iterator",
            "task": self.task.name,
            "state": self.state,
            "window": self.window,
            "queue": queue,
            "retention": self.retention,
            **self.start,
        }

"""The task that runs an iterator's function, one step at a time (see canvas.iterator)."""

from __future__ import annotations

from typing import Any

from ..exceptions import InvalidTask, NonRetryableError
from ..registry import find_task_type, task
from ..tracing import stamp_node
from .canvas import Step
from .planner import ITERATE_TASK


@task(name=ITERATE_TASK)
def iterate(iterator: str, state: Any) -> dict[str, Any]:
    """Call the iterator's function with its state; return its new state and next children."""
    task_type = find_task_type(iterator)
    if task_type is None:
        raise NonRetryableError(f"No task type is registered as {iterator!r}.")
    step = task_type.func(state)
    if step is None:
        return {"state": state, "children": [], "done": True}
    try:
        new_state, children = step
    except (TypeError, ValueError):
        raise NonRetryableError(
            f"Iterator {iterator!r} returned {step!r}: expected (new_state, [signatures]) or None."
        ) from None
    nodes = []
    for child in children:
        if not isinstance(child, Step):
            raise NonRetryableError(
                f"Iterator {iterator!r} made {child!r}: expected task.s(...) or a workflow."
            )
        try:
            nodes.append(stamp_node(child.node()))
        except InvalidTask as exc:  # WorkflowTooDeep: it would fail the same way every time
            raise NonRetryableError(f"Iterator {iterator!r} made a child that cannot run: {exc}") from None
    return {"state": new_state, "children": nodes, "done": not nodes}

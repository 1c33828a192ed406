"""What the test app's tasks report of their runs, and waiting for a task to reach a state."""

from __future__ import annotations

from django_rtq.broker import TaskState
from django_rtq.broker.inspect import Inspector, TaskInfo
from django_rtq.exceptions import TaskNotFound
from tests.support.polling import wait_for
from tests.testapp import tasks


def reports(redis_client, name: str) -> list[str]:
    """What the test app's tasks reported under `name`, oldest first."""
    return redis_client.lrange(tasks.report_key(name), 0, -1)


def task_state(inspector: Inspector, task_id: str) -> TaskState | None:
    """The task's live state; None once Redis no longer holds it."""
    try:
        return inspector.get_task(task_id).state
    except TaskNotFound:
        return None


def wait_state(
    inspector: Inspector, task_id: str, state: TaskState | None, timeout: float = 10.0
) -> TaskInfo | None:
    """Wait until the task is in `state` (None: gone from Redis); return it as read then."""
    wait_for(
        lambda: task_state(inspector, task_id) == state,
        timeout,
        message=f"task {task_id} to be {state}",
    )
    return inspector.get_task(task_id) if state else None

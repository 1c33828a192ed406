"""Factories: task messages and tasks put straight into a state of a queue, on a real Redis."""

from __future__ import annotations

import json
import uuid

from django_rtq import registry
from django_rtq.broker import Broker, ClaimedTask, Completion, TaskMessage, TaskState, manual, workflow
from django_rtq.broker.manual import CANCELLED
from tests.support.clock import START_TIME, FakeClock

#: Three queues whose keys land on the three different nodes of the test cluster.
QUEUES = EMAILS, SEARCH, BILLING = ("emails", "search", "billing")
WORKER = "worker-1"
OTHER_WORKER = "worker-2"
LEASE_SECONDS = 30.0


def message(queue: str = EMAILS, **fields) -> TaskMessage:
    fields.setdefault("id", uuid.uuid4().hex)
    fields.setdefault("enqueued_at", START_TIME)
    fields.setdefault("task", "tests.noop")
    return TaskMessage(queue=queue, **fields)


def enqueue(broker: Broker, queue: str = EMAILS, count: int = 1, **fields) -> list[str]:
    messages = [message(queue, **fields) for _ in range(count)]
    broker.enqueue(messages)
    return [m.id for m in messages]


def claim(
    broker: Broker,
    queue: str = EMAILS,
    *,
    worker: str = WORKER,
    limit: int = 100,
    lease: float = LEASE_SECONDS,
) -> list[ClaimedTask]:
    broker.lease_ms = int(lease * 1000)
    return broker.claim(queue, worker_id=worker, limit=limit)


def claim_ids(broker: Broker, queue: str = EMAILS, **options) -> list[str]:
    return [task.id for task in claim(broker, queue, **options)]


def done(
    task_id: str, *, retention: float = 0, result=None, unique_key: str | None = None, run: str = "1"
) -> Completion:
    """The success of a task's run (the first claim of a task is run 1)."""
    return Completion(
        id=task_id,
        run=run,
        info={"done": True},
        result_json=json.dumps(result),
        retention_ms=int(retention * 1000),
        unique_key=unique_key,
    )


def fail(broker: Broker, queue: str, task_id: str, to: TaskState, **options) -> bool:
    options.setdefault("worker_id", WORKER)
    options.setdefault("run", "1")
    options.setdefault("info", {"error": "boom"})
    return broker.fail(queue, task_id, to=to, **options)


def make_tasks(broker: Broker, state: TaskState, queue: str = EMAILS, count: int = 1, **fields) -> list[str]:
    """Put `count` new tasks in `state` (retry and scheduled ones fall due in 60 s)."""
    if state == TaskState.SCHEDULED:
        return enqueue(broker, queue, count, process_at=broker.clock() + 60, **fields)
    if state == TaskState.WAITING:
        return make_workflows(broker, queue, count)
    ids = enqueue(broker, queue, count, **fields)
    if state == TaskState.PENDING:
        return ids
    assert claim_ids(broker, queue, limit=count) == ids
    if state == TaskState.COMPLETED:
        broker.complete(queue, [done(i, retention=60) for i in ids], worker_id=WORKER)
    elif state in (TaskState.RETRY, TaskState.ARCHIVED):
        unique_key = fields.get("unique_key")
        retry_at_ms = broker.now_ms() + 60_000
        for task_id in ids:
            fail(broker, queue, task_id, state, retry_at_ms=retry_at_ms, unique_key=unique_key)
    return ids


def make_workflows(broker: Broker, queue: str, count: int) -> list[str]:
    """Create `count` groups waiting for one child each (not enqueued)."""
    ids = [uuid.uuid4().hex for _ in range(count)]
    fields = {"kind": "group", "n": 1, "done": 0, "queue": queue, "on_error": "fail", "retention": 0}
    workflow.activate(
        broker,
        queue,
        cmd_id="",
        workflows=[
            {
                "id": i,
                "msg": TaskMessage(id=i, task="django_rtq.group", queue=queue).to_json(),
                "fields": fields,
                "commands": [],
            }
            for i in ids
        ],
    )
    return ids


def make_each(
    broker: Broker, states: dict[TaskState, int], queue: str = EMAILS
) -> dict[TaskState, list[str]]:
    """Make tasks in several states; pending ones last, as making the others claims pending."""
    order = sorted(states, key=lambda state: state == TaskState.PENDING)
    return {state: make_tasks(broker, state, queue, count=states[state]) for state in order}


def finished_workflows(broker: Broker, count: int) -> list[str]:
    """Make `count` workflows of EMAILS and cancel them: archived, finished."""
    ids = make_tasks(broker, TaskState.WAITING, EMAILS, count=count)
    for workflow_id in ids:
        assert workflow.cancel_workflow(broker, EMAILS, workflow_id, error_type=CANCELLED, message="x")
    return ids


def archive_at(broker: Broker, clock: FakeClock, count: int) -> list[str]:
    """Archive `count` pending tasks of EMAILS one second apart, oldest first."""
    ids = enqueue(broker, EMAILS, count)
    for task_id in ids:
        manual.archive(broker, EMAILS, [task_id])
        clock.advance(1)
    return ids


def forget(name: str) -> None:
    """Take a task type out of the registry, as if never registered (for what it derives too)."""
    registry.unregister_task(name)


def failed_call(
    broker: Broker,
    task_type,
    args: list,
    kwargs: dict | None = None,
    *,
    to: TaskState = TaskState.ARCHIVED,
    error_type: str = "builtins.ZeroDivisionError",
) -> str:
    """A call of a registered task type put in `to` (archived or retry) as a worker would after
    its handler raised `error_type` (a class path); its retry falls due in ten minutes."""
    from django_rtq.message_builder import build_message

    built = build_message(task_type, args, kwargs or {})
    broker.enqueue([built])
    assert claim_ids(broker, built.queue) == [built.id]
    info = {"error": "boom", "error_type": error_type}
    assert fail(broker, built.queue, built.id, to, retry_at_ms=broker.now_ms() + 600_000, info=info)
    return built.id

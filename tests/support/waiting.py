"""Tasks left waiting for a worker that can run them ("parked", broker/waiting.py), made on a real
Redis as a worker that cannot run them leaves them, for the tests of the surfaces that show them."""

from __future__ import annotations

import uuid

from django_rtq.broker import Broker, TaskMessage
from django_rtq.broker.message import MAX_PRIORITY
from django_rtq.broker.waiting import UNKNOWN_TYPE, Abilities, kind_of
from tests.support.clock import START_TIME

#: A task type no module defines: no worker of any release can run it.
UNKNOWN_TASK = "tests.gone.unknown"
#: The worker that claims and leaves them.
PARKING_WORKER = "worker-that-cannot"


def park(
    broker: Broker,
    queue: str,
    task: str = UNKNOWN_TASK,
    count: int = 1,
    *,
    why: str = UNKNOWN_TYPE,
    reason: str | None = None,
) -> list[str]:
    """Enqueue `count` tasks of `task` to `queue`, claim them and leave them for a worker that can
    run them, as a worker that cannot does (why: "type", "format" or "args"); return their ids.

    They are enqueued at the highest priority, so that the claim takes them and no other task
    of the queue; parked, they wait after every task that can run, whatever their priority."""
    messages = [
        TaskMessage(
            id=uuid.uuid4().hex, task=task, queue=queue, enqueued_at=START_TIME, priority=MAX_PRIORITY
        )
        for _ in range(count)
    ]
    broker.enqueue(messages)
    ids = [m.id for m in messages]
    claimed = broker.claim(queue, worker_id=PARKING_WORKER, limit=count)
    if claimed.unjudged_kinds:  # tasks parked before: this worker cannot run them either
        cannot_run = Abilities(cannot_run="\n".join(claimed.unjudged_kinds))
        claimed = broker.claim(queue, worker_id=PARKING_WORKER, limit=count, abilities=cannot_run)
    assert [claimed_task.id for claimed_task in claimed] == ids, "the queue had tasks of higher priority"
    kind, reason = kind_of(task, why), reason or f"unknown task type {task!r}"
    parked = broker.park(
        queue, worker_id=PARKING_WORKER, entries=[(t.id, t.run, kind, reason) for t in claimed]
    )
    assert parked == count
    return ids

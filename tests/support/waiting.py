"""Tasks left waiting for a worker that can run them ("parked", broker/waiting.py), made on a real
Redis for the tests of the surfaces that show them."""

from __future__ import annotations

import json
import uuid

from django_rtq.broker import Broker, TaskMessage
from django_rtq.broker.waiting import PARKED_BASE, UNKNOWN_TYPE, kind_of
from tests.support.clock import START_TIME

#: A task type no module defines: no worker of any release can run it.
UNKNOWN_TASK = "tests.gone.unknown"


def park(
    broker: Broker,
    queue: str,
    task: str = UNKNOWN_TASK,
    count: int = 1,
    *,
    why: str = UNKNOWN_TYPE,
    reason: str | None = None,
) -> list[str]:
    """Enqueue `count` tasks of `task` to `queue` and leave them waiting for a worker that can run
    them, as a worker that cannot does (why: "type", "format" or "args"); return their ids."""
    messages = [
        TaskMessage(id=uuid.uuid4().hex, task=task, queue=queue, enqueued_at=START_TIME) for _ in range(count)
    ]
    broker.enqueue(messages)
    reason = reason or f"unknown task type {task!r}"
    # Until Broker.park is there, the keys as park.lua leaves them (docs/design.md, "parked").
    qk = broker.queue(queue)
    kind = kind_of(task, why)
    ids = [m.id for m in messages]
    scores = dict(zip(ids, broker.client.zmscore(qk.pending, ids), strict=True))
    pipe = broker.client.pipeline(transaction=True)
    for task_id, score in scores.items():
        pipe.zadd(qk.pending, {task_id: PARKED_BASE + score})
        pipe.zadd(qk.parked, {f"{kind}\0{score:017.0f}\0{task_id}": 0})
    pipe.hsetnx(qk.parked_kinds, kind, json.dumps({"since": broker.now_ms(), "reason": reason}))
    pipe.execute()
    return ids

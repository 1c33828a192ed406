"""Snoozing a task: back to scheduled for a while, no attempt counted, its type held if asked."""

from __future__ import annotations

import json
from typing import Any

from .broker import Broker, utc_day
from .errors import translate_errors


def snooze(
    broker: Broker,
    queue: str,
    task_id: str,
    *,
    worker_id: str,
    run: str,
    delay_ms: int,
    info: dict[str, Any],
    hold_task: str | None = None,
) -> int | None:
    """Move a task whose handler raised Snooze to scheduled, due `delay_ms` from now on the
    Redis server's clock, with `info` as its attempt facts; with `hold_task` (a type's name, or a
    partition's scope: `partition_scope`), no task of that type, or partition, starts in the queue
    before then (snooze.lua). Return when it is due (ms), or None when the snooze came late (a
    newer run of the task has started, or it is gone)."""
    now_ms = broker.now_ms()
    qk = broker.queue(queue)
    keys = [
        qk.active, qk.owner, qk.state, qk.info, qk.scheduled, qk.runs, qk.unstarted, qk.pending,
        qk.retry, qk.slots, qk.running, qk.began, qk.holds, qk.snoozed(utc_day(now_ms / 1000)),
    ]  # fmt: skip
    args = [
        broker.clock_arg(),
        task_id,
        worker_id,
        run,
        max(0, delay_ms),
        json.dumps(info, separators=(",", ":"), allow_nan=False),
        hold_task or "",
        broker.counter_ttl,
        qk.wake_channel,
    ]
    due = broker.run_script("snooze", keys, args)
    return int(due) if due else None


def held_types(broker: Broker, queue: str) -> dict[str, int]:
    """The task types (and partitions' scopes) a snooze holds in a queue, with until when (ms;
    the server's clock), those that have ended included until a claim drops them."""
    with translate_errors():
        raw = broker.client.hgetall(broker.queue(queue).holds)
    return {task: int(until) for task, until in raw.items() if until.isdigit()}

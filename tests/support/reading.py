"""Readers of a queue's raw state in Redis (its sets, columns, counters, locks and channels)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django_rtq.broker import Broker, TaskState
from django_rtq.broker.broker import utc_day
from tests.support.polling import wait_for


def ids_in(broker: Broker, queue: str, state: TaskState) -> list[str]:
    return broker.client.zrange(broker.queue(queue).state_set(state), 0, -1)


def pending_count(broker: Broker, queue: str = "default") -> int:
    return broker.client.zcard(broker.queue(queue).pending)


def scores_in(broker: Broker, queue: str, state: TaskState) -> dict[str, float]:
    return dict(broker.client.zrange(broker.queue(queue).state_set(state), 0, -1, withscores=True))


def column(broker: Broker, queue: str, name: str, task_id: str) -> str | None:
    return broker.client.hget(getattr(broker.queue(queue), name), task_id)


def state_of(broker: Broker, queue: str, task_id: str) -> str | None:
    return column(broker, queue, "state", task_id)


def counter(broker: Broker, queue: str, kind: str) -> int:
    key = getattr(broker.queue(queue), kind)(utc_day(broker.clock()))
    return int(broker.client.get(key) or 0)


def holds_columns(broker: Broker, queue: str, task_id: str) -> list[str]:
    """Return the columns (hashes) in which the task still has a field."""
    return [key for key in broker.queue(queue).columns if broker.client.hexists(key, task_id)]


def lock_holder(broker: Broker, queue: str, unique_key: str) -> str | None:
    return broker.client.get(broker.queue(queue).unique(unique_key))


@contextmanager
def subscribed(broker: Broker, channel: str) -> Iterator[Any]:
    """Subscribe to a channel; yield the pub/sub once the subscription is confirmed."""
    pubsub = broker.client.pubsub()
    try:
        pubsub.subscribe(channel)
        assert next_message(pubsub)["type"] == "subscribe"
        yield pubsub
    finally:
        pubsub.close()


def next_message(pubsub: Any) -> dict:
    return wait_for(lambda: pubsub.get_message(timeout=0.1), timeout=5, message="a pub/sub message")

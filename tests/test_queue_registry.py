"""The registry of queues ever enqueued to (`rtq:queues`): it heals after Redis forgot it, and
one that refuses leaves no task written. Each test on a Redis server of its own, which it may
empty."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from django_rtq.broker import Broker, TaskState
from django_rtq.broker.broker import OUTBOX_SENT, QUEUE_REGISTRATION_SECONDS
from django_rtq.broker.inspect import Inspector
from tests.support.clock import FakeClock
from tests.support.factories import message
from tests.support.reading import ids_in
from tests.support.servers import RedisProcess

UNNAMED = "named-in-no-settings"
OTHER = "named-nowhere-either"


@pytest.fixture
def own_broker(clock: FakeClock) -> Iterator[Broker]:
    """A broker over a Redis server of the test's own, reading time from `clock`."""
    server = RedisProcess().start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        yield Broker(client, clock=clock)
    finally:
        client.close()
        server.stop()


def test_the_registry_heals_after_redis_forgot_it(own_broker: Broker, clock: FakeClock):
    own_broker.enqueue([message(UNNAMED)])
    own_broker.client.flushdb()  # as a restart of a Redis without persistence leaves it
    clock.advance(QUEUE_REGISTRATION_SECONDS)
    task = message(UNNAMED)

    own_broker.enqueue([task])

    assert own_broker.known_queues() == [UNNAMED]
    assert Inspector(own_broker).locate([task.id]) == {task.id: (UNNAMED, TaskState.PENDING)}


def test_a_process_registers_a_queue_once_a_period(own_broker: Broker, clock: FakeClock, monkeypatch):
    registrations = []
    sadd = own_broker.client.sadd
    monkeypatch.setattr(
        own_broker.client, "sadd", lambda key, *names: registrations.append(names) or sadd(key, *names)
    )

    own_broker.enqueue([message(UNNAMED)])
    own_broker.enqueue([message(UNNAMED), message(OTHER)])
    clock.advance(QUEUE_REGISTRATION_SECONDS - 1)
    own_broker.enqueue([message(UNNAMED)])
    clock.advance(1)
    own_broker.enqueue([message(UNNAMED)])

    assert registrations == [(UNNAMED,), (OTHER,), (UNNAMED,)]


@pytest.mark.parametrize("queues", [[UNNAMED], [UNNAMED, OTHER]], ids=["one task", "two queues"])
def test_a_wrong_typed_registry_refuses_an_enqueue_with_nothing_written(own_broker: Broker, queues):
    own_broker.client.set(own_broker.keys.queues, "not a set")
    tasks = [message(queue) for queue in queues]

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        own_broker.enqueue(tasks)

    assert [ids_in(own_broker, queue, TaskState.PENDING) for queue in queues] == [[] for _ in queues]
    own_broker.client.delete(own_broker.keys.queues)
    own_broker.enqueue(tasks)  # the caller's retry, once the key is mended, writes each once
    assert [ids_in(own_broker, task.queue, TaskState.PENDING) for task in tasks] == [[t.id] for t in tasks]


def test_a_wrong_typed_registry_sends_nothing_from_the_outbox_and_says_why(own_broker: Broker):
    own_broker.client.set(own_broker.keys.queues, "not a set")
    tasks = [message(UNNAMED), message(OTHER)]

    outcomes = own_broker.send_outboxed(tasks)

    assert [type(outcome) for outcome in outcomes] == [redis.ResponseError, redis.ResponseError]
    assert "WRONGTYPE" in str(outcomes[0])
    assert (
        ids_in(own_broker, UNNAMED, TaskState.PENDING) == ids_in(own_broker, OTHER, TaskState.PENDING) == []
    )
    own_broker.client.delete(own_broker.keys.queues)
    assert own_broker.send_outboxed(tasks) == [OUTBOX_SENT, OUTBOX_SENT]

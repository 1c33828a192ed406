"""The subscriber's reads (django_rtq/worker/subscriber.py) on a real Redis: messages published on
its channels handed on, nothing else, and its subscription kept through a killed connection."""

from __future__ import annotations

import redis

from django_rtq.broker import Broker
from django_rtq.worker.subscriber import Subscriber
from tests.support.polling import wait_for


def subscriber(broker: Broker, got: list, *channels: str) -> Subscriber:
    listening = Subscriber(
        broker=broker,
        channels=channels,
        on_message=lambda channel, data: got.append((channel, data)),
        name="t",
    )
    listening.listen(0)  # subscribes
    wait_for(lambda: all(n == 1 for _, n in broker.client.pubsub_numsub(*channels)))
    return listening


def published(broker: Broker, listening: Subscriber, got: list, channel: str, data: str) -> bool:
    """Publish once more unless it has come; listen a moment."""
    if (channel, data) not in got:
        broker.client.publish(channel, data)
        listening.listen(0.05)
    return (channel, data) in got


def test_messages_on_its_channels_are_handed_on_and_nothing_else(broker, prefix):
    got: list = []
    listening = subscriber(broker, got, f"{prefix}:a", f"{prefix}:b")
    try:
        broker.client.publish(f"{prefix}:a", "one")
        broker.client.publish(f"{prefix}:b", "two\nlines")
        wait_for(lambda: listening.listen(0.05) is None and len(got) == 2)

        assert got == [(f"{prefix}:a", "one"), (f"{prefix}:b", "two\nlines")]
    finally:
        listening.stop()


def test_it_subscribes_again_after_its_connection_is_killed(broker, prefix):
    got: list = []
    listening = subscriber(broker, got, f"{prefix}:a")
    try:
        host, port = listening._pubsub.connection._sock.getsockname()[:2]  # its address, as Redis sees it
        assert broker.client.client_kill_filter(addr=f"{host}:{port}") == 1

        wait_for(lambda: published(broker, listening, got, f"{prefix}:a", "after"), timeout=10)
    finally:
        listening.stop()


def test_a_client_with_health_checks_gets_its_messages_too(redis_url, prefix):
    client = redis.Redis.from_url(redis_url, decode_responses=True, health_check_interval=1)
    broker = Broker(client, prefix=prefix)
    got: list = []
    listening = subscriber(broker, got, f"{prefix}:a")
    try:
        wait_for(lambda: published(broker, listening, got, f"{prefix}:a", "checked"))
    finally:
        listening.stop()
        client.close()

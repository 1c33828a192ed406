"""The subscriber's reads (django_rtq/worker/subscriber.py) on a real Redis: messages published on
its channels handed on, nothing else, and its subscription kept through a killed connection."""

from __future__ import annotations

import redis

from django_rtq.broker import Broker
from django_rtq.worker.subscriber import Subscriber
from tests.support.polling import wait_for
from tests.support.proxy import TCPProxy


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


def test_waits_that_end_empty_keep_the_subscription(broker, prefix):
    got: list = []
    listening = subscriber(broker, got, f"{prefix}:a")
    try:
        connection = listening._pubsub.connection
        assert [listening.listen(0.02) for _ in range(3)] == [None, None, None]

        wait_for(lambda: published(broker, listening, got, f"{prefix}:a", "after the waits"))
        assert listening._pubsub.connection is connection and connection._sock is not None  # not reconnected
    finally:
        listening.stop()


def test_a_message_that_comes_in_pieces_across_waits_is_read_whole(redis_url, broker, prefix):
    """Through a proxy that passes on at most 64 KiB every 0.2 s, a 300 kB message comes in five
    pieces or more, and waits of 0.05 s end between them with a part of it read: the next waits
    read the rest, and it is handed on whole, once."""
    url = redis.connection.parse_url(redis_url)
    proxy = TCPProxy(url.get("host", "127.0.0.1"), url.get("port", 6379), delay=0.2).up()
    client = redis.Redis(port=proxy.port, db=url.get("db", 0), decode_responses=True)
    got: list = []
    listening = subscriber(Broker(client, prefix=prefix), got, f"{prefix}:big")
    try:
        big = "x" * 300_000 + "end"
        assert broker.client.publish(f"{prefix}:big", big) == 1
        empty_waits = ended_with_a_part = 0
        while not got:
            if listening.listen(0.05) is None:
                empty_waits += 1
                ended_with_a_part += listening._pubsub.connection._parser._reader.has_data()  # hiredis
            assert empty_waits < 200, "the message did not come"

        assert got == [(f"{prefix}:big", big)]
        assert ended_with_a_part >= 2  # waits did end in the middle of it
        broker.client.publish(f"{prefix}:big", "next")
        wait_for(lambda: listening.listen(0.05) is None and len(got) == 2, timeout=10)
        assert got[1] == (f"{prefix}:big", "next")
    finally:
        listening.stop()
        client.close()
        proxy.down()

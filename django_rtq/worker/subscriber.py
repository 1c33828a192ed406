"""The subscriber listens on pub/sub channels: cancellation requests, and wake-ups for idle workers."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Sequence

import redis

from ..broker import Broker
from .component import Component

logger = logging.getLogger(__name__)

#: Seconds a listener waits for a message before it checks whether to stop.
POLL_SECONDS = 0.25
#: Seconds to wait before subscribing again after the connection broke.
RETRY_SECONDS = 1.0


class Subscriber(Component):
    """The subscriber hands every message on its channels to `on_message(channel, data)`,
    subscribing again whenever the connection breaks.

    The worker starts one, in a thread of its own, on the cancel channel to stop running tasks.
    The processor's fetcher drives another by calling `listen()` while it is idle, on its
    queues' wake-up and hand-off channels, so that it gets to work as soon as work comes.
    """

    def __init__(
        self,
        *,
        broker: Broker,
        channels: Sequence[str],
        on_message: Callable[[str, str], object] = lambda channel, data: None,
        name: str,
    ) -> None:
        self.name = name
        super().__init__(interval=0)  # in a thread of its own, it listens again at once
        self.broker = broker
        self.channels = list(channels)
        self.on_message = on_message
        self.subscribed = threading.Event()
        self._pubsub: redis.client.PubSub | None = None
        self._lost_in_a_row = 0

    def listen(self, timeout: float = POLL_SECONDS) -> str | None:
        """Wait up to `timeout` seconds for one message and hand it on; return its data."""
        try:
            if self._pubsub is None:
                self._pubsub = self.broker.client.pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(*self.channels)
                self.subscribed.set()
                self._lost_in_a_row = 0
            published = self._next_message(self._pubsub, timeout)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._lost_in_a_row += 1
            # Once in a row: while Redis stays away, the healthchecker speaks for the outage.
            level = logging.WARNING if self._lost_in_a_row == 1 else logging.DEBUG
            logger.log(level, "%s subscription lost (%s); subscribing again", self.name, exc)
            self.close()
            self._stop.wait(RETRY_SECONDS)
            return None
        if published is None:
            return None
        channel, data = published
        self.on_message(channel, data)
        return data

    @staticmethod
    def _next_message(pubsub: redis.client.PubSub, timeout: float) -> tuple[str, str] | None:
        """The next message published on the channels, as (channel, data), within `timeout`
        seconds; None if none came (or something else did: a subscription's confirmation).

        This is the way of every task handed over, so it is short: a wait is one read that
        blocks until a message comes or `timeout` passes, and a published message is taken off
        the connection as read. redis-py's `get_message`, made for every kind of reply, polls the
        socket, looks again whether it closed and sets its timeout back between the wake-up and
        the read: on an idle worker it has the message 60-70 µs later (bench/wake_reads.py). Any
        other reply goes through redis-py's handling; a lost connection, and a connection with
        health checks (`health_check_interval`), through redis-py's own read, which reconnects
        and subscribes again."""
        connection = pubsub.connection
        if connection is None or connection.health_check_interval or connection._sock is None:
            return _published(pubsub.get_message(timeout=timeout))
        try:
            if timeout > 0 and isinstance(connection._sock, socket.socket):
                reply = _read_within(connection, timeout)
            elif connection.can_read(timeout=timeout):  # a look, or a connection of fakeredis
                reply = connection.read_response(disconnect_on_error=False, push_request=True)
            else:
                return None
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return _published(pubsub.get_message(timeout=0))
        if reply is None:
            return None
        if isinstance(reply, list) and len(reply) == 3 and reply[0] == "message":  # hiredis: a list subclass
            return reply[1], reply[2]
        return _published(pubsub.handle_message(reply, ignore_subscribe_messages=True))

    def close(self) -> None:
        self.subscribed.clear()
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()

    def run_once(self) -> None:
        self.listen()

    def stop(self, timeout: float | None = 5.0) -> None:
        super().stop(timeout)
        self.close()


def _read_within(connection: redis.connection.AbstractConnection, timeout: float) -> object | None:
    """The next reply on a subscribed connection, or None if none was whole within `timeout`
    seconds.

    The socket's timeout is set before the read blocks, and left so for the next wait, which is
    most often as long: setting it costs a system call, and after the message came it would be
    paid on the way of the task. A reply cut short by the timeout stays in the parser's buffer,
    and the next read finishes it."""
    sock = connection._sock
    if sock.gettimeout() != timeout:
        sock.settimeout(timeout)
    try:
        return connection.read_response(disconnect_on_error=False, push_request=True)
    except redis.TimeoutError:
        return None


def _published(message: dict | None) -> tuple[str, str] | None:
    """(channel, data) of a message redis-py parsed, if it is a published one."""
    if message and message.get("type") in ("message", "smessage"):
        return message["channel"], message["data"]
    return None

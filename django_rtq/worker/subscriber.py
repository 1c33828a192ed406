"""The subscriber listens on pub/sub channels: cancellation requests, and wake-ups for idle workers."""

from __future__ import annotations

import contextlib
import logging
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
            message = self._pubsub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._lost_in_a_row += 1
            # Once in a row: while Redis stays away, the healthchecker speaks for the outage.
            level = logging.WARNING if self._lost_in_a_row == 1 else logging.DEBUG
            logger.log(level, "%s subscription lost (%s); subscribing again", self.name, exc)
            self.close()
            self._stop.wait(RETRY_SECONDS)
            return None
        if message and message.get("type") in ("message", "smessage"):
            self.on_message(message["channel"], message["data"])
            return message["data"]
        return None

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

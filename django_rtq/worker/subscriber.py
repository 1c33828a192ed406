"""The subscriber listens on pub/sub channels: cancellation requests, and wake-ups for idle workers."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

import redis

from ..broker import Broker

logger = logging.getLogger(__name__)

#: Seconds a listener waits for a message before it checks whether to stop.
POLL_SECONDS = 0.25
#: Seconds to wait before subscribing again after the connection broke.
RETRY_SECONDS = 1.0


class Subscriber:
    """The subscriber hands every message on its channels to `on_message`, subscribing again
    whenever the connection breaks. The worker runs one on the cancel channel (to stop running
    tasks) and the processor one on its queues' wake channels (to claim as soon as work comes)."""

    def __init__(
        self, *, broker: Broker, channels: Sequence[str], on_message: Callable[[str], object], name: str
    ) -> None:
        self.broker = broker
        self.channels = list(channels)
        self.on_message = on_message
        self.name = name
        self.subscribed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"rtq-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            pubsub = self.broker.client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(*self.channels)
                self.subscribed.set()
                while not self._stop.is_set():
                    self.run_once(pubsub)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.subscribed.clear()
                logger.warning("%s subscription lost (%s); subscribing again", self.name, exc)
                self._stop.wait(RETRY_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def run_once(self, pubsub: redis.client.PubSub, timeout: float = POLL_SECONDS) -> str | None:
        """Wait up to `timeout` seconds for one message and hand it on; return its data."""
        message = pubsub.get_message(timeout=timeout)
        if message and message.get("type") in ("message", "smessage"):
            self.on_message(message["data"])
            return message["data"]
        return None

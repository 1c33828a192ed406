"""The subscriber listens for cancellation requests and stops the matching running task."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from ..broker import Broker
from .processor import PUBSUB_POLL_SECONDS

logger = logging.getLogger(__name__)

#: Seconds to wait before subscribing again after the connection broke.
RETRY_SECONDS = 1.0


class Subscriber:
    """The subscriber receives task ids on the cancel channel and hands them to `on_cancel`."""

    name = "subscriber"

    def __init__(self, *, broker: Broker, on_cancel: Callable[[str], object]) -> None:
        self.broker = broker
        self.on_cancel = on_cancel
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pubsub = None
        self.subscribed = threading.Event()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rtq-subscriber", daemon=True)
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
                pubsub.subscribe(self.broker.keys.cancel_channel)
                self.subscribed.set()
                while not self._stop.is_set():
                    self.run_once(pubsub)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.subscribed.clear()
                logger.warning("cancel subscription lost (%s); subscribing again", exc)
                self._stop.wait(RETRY_SECONDS)
            finally:
                pubsub.close()

    def run_once(self, pubsub, timeout: float = PUBSUB_POLL_SECONDS) -> str | None:
        message = pubsub.get_message(timeout=timeout)
        if message and message.get("type") == "message":
            task_id = message["data"]
            logger.info("cancellation requested for task %r", task_id)
            self.on_cancel(task_id)
            return task_id
        return None

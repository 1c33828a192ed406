"""The queue's clock: the Redis server's TIME, read without a round trip through a learned offset."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

logger = logging.getLogger(__name__)

#: Seconds a learned offset is trusted before the next reading asks the server's TIME again.
REFRESH_SECONDS = 30.0
#: Seconds before the next try after a TIME that failed (Redis away): meanwhile readings use
#: the last offset learned, or this host's clock if none was.
RETRY_SECONDS = 5.0


class ServerClock:
    """Epoch seconds on the Redis server's clock, as `time.time()` gives them on this host.

    Every decision of the queue about time (a scheduled task due, a deadline passed, a retry's
    backoff, a finished task's retention, a periodic tick) is taken on one clock, the server's,
    so that hosts whose clocks disagree still agree. The Lua scripts read TIME themselves; Python
    reads this: the offset between the server's TIME and this host's monotonic clock, learned
    from one TIME reply and learned again every `refresh` seconds. The offset is taken at the
    middle of the round trip, so a reading is off by at most half a round trip (plus the drift
    of the monotonic clock since the last TIME); a step of this host's wall clock changes
    nothing. Until a TIME reply arrives (Redis away since the process started) it reads this
    host's clock.
    """

    def __init__(self, client: Any, *, refresh: float = REFRESH_SECONDS) -> None:
        self.client = client
        self.refresh = refresh
        self._offset: float | None = None  # server epoch seconds minus time.monotonic()
        self._due = 0.0  # time.monotonic() at which the next reading asks TIME
        self._asking = threading.Lock()

    def __call__(self) -> float:
        if time.monotonic() >= self._due:
            self._learn()
        return self.last_known()

    def last_known(self) -> float:
        """The time by the offset learned last, without asking the server."""
        offset = self._offset
        return time.time() if offset is None else time.monotonic() + offset

    @property
    def offset(self) -> float | None:
        """Seconds the server's clock is ahead of this host's wall clock (None: not learned yet)."""
        return None if self._offset is None else self._offset + time.monotonic() - time.time()

    def _learn(self) -> None:
        # One thread asks; the others read the offset they have meanwhile.
        if not self._asking.acquire(blocking=False):
            return
        try:
            sent = time.monotonic()
            self._due = sent + RETRY_SECONDS
            try:
                seconds, microseconds = self.client.time()
            except (redis.RedisError, OSError) as exc:
                logger.debug("could not read the Redis server's clock: %s", exc)
                return
            received = time.monotonic()
            self._offset = int(seconds) + int(microseconds) / 1e6 - (sent + received) / 2
            self._due = received + self.refresh
        finally:
            self._asking.release()

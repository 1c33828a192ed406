"""A clock that stands still until the test moves it, its fixture `clock`, and the queue's
clock as tests read it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_rtq.connection import queue_time

#: A FakeClock starts here (2023-11-14 22:13:20 UTC).
START_TIME = 1_700_000_000.0


class FakeClock:
    """A clock that stands still until the test moves it."""

    def __init__(self, now: float = START_TIME) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def ms(self, seconds_from_now: float = 0.0) -> int:
        return int((self.now + seconds_from_now) * 1000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def queue_now() -> datetime:
    """Now on the queue's clock (the Redis server's, read through this process's learned offset),
    which stored times are reckoned on: a bound for them that the host's clock is not."""
    return datetime.fromtimestamp(queue_time(), tz=UTC)

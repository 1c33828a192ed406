"""A clock that stands still until the test moves it, and its fixture `clock`."""

from __future__ import annotations

import pytest

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

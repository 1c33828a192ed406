"""The one way the tests wait: poll a condition until it holds or a timeout passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "",
    ignoring: tuple[type[BaseException], ...] = (),
    fail: bool = True,
) -> T | None:
    """Poll `condition` until it returns something truthy, and return that. After `timeout`
    seconds, fail the test; or, with `fail=False`, return None (for a caller that reports the
    miss itself, as the chaos scenarios do). Exceptions of the types in `ignoring` count as "not
    yet"; the last one is named in the failure."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
        except ignoring as exc:
            last_error = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            if not fail:
                return None
            cause = f" (last error: {last_error!r})" if last_error else ""
            pytest.fail(f"timed out after {timeout}s waiting for {message or condition}{cause}")
        time.sleep(interval)

"""Retry delays: the default exponential backoff with jitter, and how a task's choice is read."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

#: The first retry waits about this long (seconds); each one after waits twice as long.
BACKOFF_BASE_SECONDS = 5.0
#: No retry waits longer than this (seconds).
BACKOFF_CAP_SECONDS = 3600.0

Backoff = Callable[[int, BaseException], float]


def exponential_backoff(retried: int, exc: BaseException) -> float:
    """Wait base * 2**retried seconds, capped, with jitter spreading retries of a burst."""
    delay = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2**retried)
    return delay * random.uniform(0.5, 1.0)


def resolve_backoff(value: Any) -> Backoff:
    """Accept a callable `(retried, exc) -> seconds`, its dotted path, or a fixed number of seconds."""
    if isinstance(value, str):
        value = import_string(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        return lambda retried, exc: seconds
    if not callable(value):
        raise TypeError(f"retry_backoff must be a callable, a dotted path or seconds, not {value!r}.")
    return value

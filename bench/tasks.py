"""The tasks the benchmarks run."""

import time

from django_rtq import get_broker, task
from django_rtq.conf import get_settings


def stamps_key() -> str:
    """The Redis list `stamp` pushes onto: under the run's key prefix, so cleanup finds it."""
    return f"{get_settings().KEY_PREFIX}:bench:stamps"


@task
def noop() -> None:
    """Do nothing: what is measured is the queue's own cost."""


@task
def stamp(token: str) -> None:
    """Push "<token> <time.time()>" onto the run's stamps list, for end-to-end latency."""
    now = time.time()
    get_broker().client.rpush(stamps_key(), f"{token} {now!r}")


@task
def chunks(n: int, size: int) -> list[list[int]]:
    """A map step: 0..n-1 in chunks of `size`."""
    return [list(range(start, min(start + size, n))) for start in range(0, n, size)]


@task
def chunk_sum(chunk: list[int]) -> int:
    return sum(chunk)


@task
def total(values: list[int]) -> int:
    return sum(values)


@task
def inc(value: int) -> int:
    return value + 1

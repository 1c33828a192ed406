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

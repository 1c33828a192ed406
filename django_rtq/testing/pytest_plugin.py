"""pytest fixtures of the testing helpers: `pytest_plugins = ["django_rtq.testing.pytest_plugin"]`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def rtq_capture() -> Iterator[Any]:
    """Capture the tasks the test enqueues (a `CapturedTasks`); nothing reaches Redis."""
    from .capture import capture_tasks

    with capture_tasks() as captured:
        yield captured


@pytest.fixture
def rtq_eager() -> Iterator[Any]:
    """Run each task the test enqueues at once, in the test (an `EagerRuns`); errors propagate."""
    from .eager import run_eagerly

    with run_eagerly() as runs:
        yield runs


@pytest.fixture
def rtq_fake_redis() -> Iterator[Any]:
    """django-rtq on a fakeredis server of the test's own; the fixture is a client of it."""
    from .fake import use_fake_redis

    with use_fake_redis() as client:
        yield client


@pytest.fixture
def rtq_worker() -> Callable[..., Any]:
    """`rtq_worker(queues=None, concurrency=1, timeout=30)`: run a burst worker, get its summary."""
    from .worker import run_worker_burst

    return run_worker_burst

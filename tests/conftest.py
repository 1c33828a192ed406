"""Fixtures: a real Redis for every test, each test under its own key prefix."""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager

import pytest
import redis

from django_rtq.broker import Broker
from django_rtq.connection import reset_broker

pytest_plugins = [
    "tests.support.clock",
    "tests.support.cluster",
    "tests.support.commands",
    "tests.support.database",
    "tests.support.fixtures",
    "tests.support.processes",
    "tests.support.users",
    "django_rtq.testing.pytest_plugin",
]

REDIS_URL = os.environ.get("RTQ_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"The test suite needs a Redis server at {REDIS_URL} (set RTQ_REDIS_URL): {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def redis_client(redis_url: str):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def prefix(settings, redis_client, monkeypatch) -> str:
    """A key prefix of this test's own, set in settings.RTQ and for worker subprocesses."""
    name = f"rtqt-{uuid.uuid4().hex[:10]}"
    settings.RTQ = {**settings.RTQ, "KEY_PREFIX": name}
    monkeypatch.setenv("RTQ_TEST_PREFIX", name)
    reset_broker()
    yield name
    reset_broker()
    for pattern in (f"{name}:*", f"rtqtest-report:{name}:*"):
        keys = list(redis_client.scan_iter(pattern, count=1000))
        if keys:
            redis_client.delete(*keys)


@pytest.fixture
def broker(prefix: str, redis_url: str) -> Broker:
    """A broker over the real Redis, on this test's prefix."""
    from django_rtq.connection import get_broker

    return get_broker()


@pytest.fixture
def inspector(broker):
    from django_rtq.broker.inspect import Inspector

    return Inspector(broker)


@pytest.fixture
def run_worker(broker):
    """Run in-process workers over the test's broker: `with run_worker(queues=...) as worker:`."""
    from django_rtq.worker.server import Worker

    started = []

    @contextmanager
    def run(**options):
        options.setdefault("queues", {"default": 1})
        options.setdefault("relay", False)  # the outbox's relay reads the database: its tests ask
        worker = Worker(broker=broker, **options)
        worker.start()
        started.append(worker)
        try:
            yield worker
        finally:
            if worker in started:
                started.remove(worker)
                worker.stop()

    yield run
    for worker in started:
        worker.stop()

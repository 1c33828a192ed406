"""Fixtures: a real Redis for every test, each test under its own key prefix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from django_rtq.broker import Broker
from django_rtq.connection import reset_broker

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.cluster", "django_rtq.testing.pytest_plugin"]

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


def wait_for(
    condition: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str = "",
):
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message or condition}")
        time.sleep(interval)


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


@pytest.fixture
def start_worker(broker, prefix):
    """Start real `rtq_worker` processes on the test's key prefix: `start_worker(*args, lease=, **env)`."""
    processes = []

    def start(*args: str, lease: float = 30, **env: str) -> subprocess.Popen:
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "RTQ_TEST_PREFIX": prefix,
            "RTQ_TEST_LEASE": str(lease),
            **env,
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "django", "rtq_worker", "--loglevel", "WARNING", *args],
            env=environment,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()

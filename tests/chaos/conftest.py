"""Fixtures of the chaos suite: a Redis server of each test's own and the chaos project."""

from __future__ import annotations

import pytest

from tests.chaos.harness import Chaos, Redis


@pytest.fixture
def redis_servers():
    """Start `Redis(*extra)` servers on free loopback ports: `redis_servers(*extra)`."""
    started = []

    def start(*extra: str) -> Redis:
        server = Redis(*extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def chaos_project(tmp_path):
    """Make the chaos project in tmp_path (migrated) for a Redis URL: `chaos_project(url, worker_url=,
    database="sqlite" or "postgresql", tasks_outbox=False)`; with `directory=name`, in a directory
    of that name in tmp_path (for a test of two projects; settings=, path=, key_prefix= name
    the other project: see Chaos)."""
    made = []

    def make(
        redis_url: str, worker_url: str | None = None, *, directory: str | None = None, **options
    ) -> Chaos:
        where = tmp_path
        if directory:
            where = tmp_path / directory
            where.mkdir()
        chaos = Chaos(where, redis_url, worker_url, **options)
        made.append(chaos)
        return chaos

    yield make
    for chaos in made:
        chaos.close()

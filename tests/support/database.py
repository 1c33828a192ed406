"""A real outage of the test database for worker threads, on SQLite or PostgreSQL: the fixture
`database_outage`, whose `down()` and `up()` cut it and bring it back."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from tests.support.proxy import TCPProxy


class SQLiteOutage:
    """Another connection holding an exclusive lock: every write fails with 'database is locked'."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.holder: sqlite3.Connection | None = None

    def down(self) -> None:
        self.holder = sqlite3.connect(self.path, isolation_level=None)
        self.holder.execute("BEGIN EXCLUSIVE")

    def up(self) -> None:
        self.holder.execute("ROLLBACK")
        self.holder.close()


class PostgreSQLOutage:
    """The worker reaches PostgreSQL through a proxy that is cut: connections drop, new ones fail."""

    def __init__(self, proxy: TCPProxy) -> None:
        self.proxy = proxy

    def down(self) -> None:
        self.proxy.down()

    def up(self) -> None:
        self.proxy.up()


@pytest.fixture
def database_outage() -> Iterator[SQLiteOutage | PostgreSQLOutage]:
    """An outage of the database for the connections worker threads open (not this thread's)."""
    if connection.vendor == "sqlite":
        yield SQLiteOutage(connection.settings_dict["NAME"])
        return
    assert connection.vendor == "postgresql"
    connection.ensure_connection()  # this thread's connection goes straight to the server
    shared = connections.settings["default"]  # the settings new (worker-thread) connections use
    original = shared["HOST"], shared["PORT"]
    proxy = TCPProxy(original[0] or "127.0.0.1", int(original[1] or 5432)).up()
    shared["HOST"], shared["PORT"] = "127.0.0.1", str(proxy.port)
    try:
        yield PostgreSQLOutage(proxy)
    finally:
        shared["HOST"], shared["PORT"] = original
        proxy.down()

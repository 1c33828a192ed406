"""Point django-rtq at an in-memory fakeredis server, for fast unit tests without Redis."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .. import connection
from ..broker import Broker


def fake_broker(server: Any) -> Broker:
    """A broker over a new client of the fakeredis `server`, configured as `get_broker()`'s."""
    import fakeredis

    return connection.broker_for(fakeredis.FakeRedis(server=server, decode_responses=True))


#: The fake servers of the use_fake_redis() blocks open now, innermost last.
_servers: list[Any] = []


@contextmanager
def use_fake_redis(server: Any = None) -> Iterator[Any]:
    """Inside the block, `get_broker()` (so enqueues, workers, the admin, the API and the
    commands run in this process) uses a fakeredis server instead of Redis; yield a
    `fakeredis.FakeRedis` client of that server, to look at its keys.

    The Lua scripts need fakeredis's Lua support: `pip install "fakeredis[lua]"`. A change of
    settings.RTQ inside the block builds a new broker on the same fake server. On leaving, the
    broker is reset, so the next use connects to the configured Redis again; or, for a block
    inside another one, to the outer block's fake server.
    """
    if importlib.util.find_spec("fakeredis") is None or importlib.util.find_spec("lupa") is None:
        raise ImproperlyConfigured(
            'use_fake_redis() needs fakeredis with its Lua support: pip install "fakeredis[lua]".'
        )
    import fakeredis

    server = server if server is not None else fakeredis.FakeServer()

    def rebuild(*, setting: str, **_: Any) -> None:
        if setting in ("RTQ", "CACHES"):
            connection.reset_broker()
            connection.set_broker(fake_broker(server))

    connection.reset_broker()
    connection.set_broker(fake_broker(server))
    setting_changed.connect(rebuild, weak=False)
    _servers.append(server)
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    try:
        yield client
    finally:
        _servers.pop()
        setting_changed.disconnect(rebuild)
        client.close()
        connection.reset_broker()
        if _servers:  # back to the fake server of the block this one is inside
            connection.set_broker(fake_broker(_servers[-1]))

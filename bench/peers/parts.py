"""Stamps of a latency task's way through a worker (bench/latency_parts.py): when the worker has
read the message, and when the handler starts, on the monotonic clock every process of the machine
shares. `install_worker(read)` patches them in. For huey (`read="brpop"`), the message is read
when redis-py's `Redis.brpop` returns it; for django-rtq (`read="pubsub"`), when redis-py's
connection has parsed a published message (`read_response`: the subscriber reads it so, and
hands it on in a few lines)."""

from __future__ import annotations

import functools
import time
from typing import Any

import redis.client
import redis.connection

from bench.peers import common

#: The list each worker appends "<token> <message read> <handler started>" (ns) to.
PARTS_KEY = f"{common.PREFIX}:parts"

_read_at = [0]


def install_worker(read: str) -> None:
    owner = redis.client.Redis if read == "brpop" else redis.connection.AbstractConnection
    name = "brpop" if read == "brpop" else "read_response"
    original = getattr(owner, name)

    @functools.wraps(original)
    def reading(*args: Any, **kwargs: Any) -> Any:
        reply = original(*args, **kwargs)
        if reply and (read == "brpop" or (isinstance(reply, list) and reply[0] == "message")):
            _read_at[0] = time.monotonic_ns()
        return reply

    setattr(owner, name, reading)
    run = common.run

    def stamped(handler: str, token: str = "") -> None:
        started = time.monotonic_ns()
        run(handler, token)
        if token:  # after the run's own stamp: not part of the latency measured
            common.client().rpush(PARTS_KEY, f"{token} {_read_at[0]} {started}")

    common.run = stamped


def stamp_sends() -> list[int]:
    """The driver's side: patch redis-py so that the first command sent once `stamps[0]` is set
    to 0 notes the time (monotonic, ns) its bytes start to leave in `stamps[0]`; return `stamps`."""
    stamps = [0]
    original = redis.connection.AbstractConnection.send_packed_command

    @functools.wraps(original)
    def sending(self: Any, command: Any, check_health: bool = True) -> Any:
        if not stamps[0]:
            stamps[0] = time.monotonic_ns()
        return original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = sending
    return stamps

"""A thread's own connection for script calls: a round trip without the pool's checkout.

redis-py takes a connection out of its pool for every command and puts it back after: a lock,
its metrics, a poll of the socket for unread data, and the same again on release. Measured on
an idle process (a task sent every 2 ms), that is 60 to 90 µs of an `EVALSHA`'s 300, and most of
what an enqueue spends before its bytes leave (bench/RESULTS.md, issue 29, fourth session).

`ScriptLane` keeps one connection of the client's pool checked out per thread and sends script
calls on it. What the pool's checkout does, it does otherwise:

- before each call it connects if need be and looks whether the socket has something to read,
  as the pool's checkout does: a server that closed the connection while the thread was away (a
  Redis restart, a `CLIENT KILL`, an idle timeout) is found then, and the call goes on a new
  connection; a server that cannot be reached raises then, as at a checkout;
- a command cut short (a lost connection, a timeout, an interrupt) leaves the connection
  disconnected, so that nothing unread is ever read as the next reply;
- a lost connection or a timeout is retried by the connection's own `Retry`, as redis-py does
  (the failed attempt's connection disconnected first);
- the connection goes back to the pool when its thread ends, and a forked child takes its own.

It holds at most half of the pool's `max_connections` (100 by default in redis-py), so that
the client's other commands always find a connection: threads beyond that send their calls the
ordinary way. It serves only clients whose pool it cannot bypass: a `redis.Redis` (not a Cluster
client, not a single-connection one) over a plain or Sentinel pool of redis-py's own connection
classes, without client-side caching. Any other client (a blocking pool, a pool of a class of
one's own, fakeredis, a Cluster) runs each call through `execute_command`, as before.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import redis
import redis.connection
import redis.sentinel

try:
    import hiredis
except ImportError:  # redis-py packs commands itself then
    hiredis = None

#: The connection classes the lane drives itself: redis-py's own, whose send and read it knows.
LANE_CONNECTIONS = (
    redis.connection.Connection,
    redis.connection.SSLConnection,
    redis.connection.UnixDomainSocketConnection,
    redis.sentinel.SentinelManagedConnection,
    redis.sentinel.SentinelManagedSSLConnection,
)


def lane_pool(client: Any) -> redis.ConnectionPool | None:
    """The pool a lane may hold connections of, or None when `client` must keep its own path."""
    if not isinstance(client, redis.Redis) or client.connection is not None:
        return None
    pool = client.connection_pool
    if type(pool) not in (redis.ConnectionPool, redis.sentinel.SentinelConnectionPool):
        return None  # a BlockingConnectionPool, or a pool of a user's own class
    if pool.connection_class not in LANE_CONNECTIONS or pool.max_connections < 2:
        return None
    if getattr(pool, "cache", None) is not None:  # client-side caching reads through the pool
        return None
    return pool


class _Slots:
    """How many connections the threads of a lane hold, against the most they may."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.held = 0
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def take(self) -> bool:
        if self.pid != os.getpid():  # a forked child: the parent's holds are not its own
            self.held, self.lock, self.pid = 0, threading.Lock(), os.getpid()
        with self.lock:
            if self.held >= self.most:
                return False
            self.held += 1
            return True

    def give_back(self) -> None:
        with self.lock:
            self.held -= 1


class _Held:
    """A connection checked out of `pool` by one thread of process `pid` (None: the lane was
    full when the thread first called, and its calls go the ordinary way)."""

    __slots__ = ("__weakref__", "connection", "pack", "pid")

    def __init__(self, pool: redis.ConnectionPool, slots: _Slots) -> None:
        self.pid = os.getpid()
        self.connection: Any = None
        self.pack: Callable[[tuple[Any, ...]], Any] = _pack_with_hiredis
        if slots.take():
            try:
                self.connection = _checkout(pool)
            except BaseException:
                slots.give_back()
                raise
            # Back to the pool once the thread that holds it ends (its thread-local data goes then).
            weakref.finalize(self, _give_back, pool, slots, self.connection, self.pid)
            if not _packs_with_hiredis(self.connection):
                self.pack = lambda args, connection=self.connection: connection.pack_command(*args)


def _packs_with_hiredis(connection: Any) -> bool:
    """Whether redis-py packs this connection's commands with hiredis (it does whenever hiredis
    is installed): the lane then calls hiredis itself, the same bytes for a third of the time."""
    serializer = getattr(redis.connection, "HiredisRespSerializer", None)
    return (
        hiredis is not None
        and serializer is not None
        and isinstance(getattr(connection, "_command_packer", None), serializer)
    )


def _pack_with_hiredis(args: tuple[Any, ...]) -> list[bytes]:
    try:
        return [hiredis.pack_command(args)]
    except TypeError as exc:  # what redis-py raises for an argument it cannot send
        raise redis.DataError(str(exc)) from exc


def _checkout(pool: redis.ConnectionPool) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py 5.0 wants a command name
        return pool.get_connection("EVALSHA")


def _give_back(pool: redis.ConnectionPool, slots: _Slots, connection: Any, pid: int) -> None:
    if os.getpid() == pid:  # a forked child's pool was reset: the parent's connection is not its own
        pool.release(connection)
        slots.give_back()


class ScriptLane:
    """Sends commands on the calling thread's own connection of `client`'s pool (see the module)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pool = lane_pool(client)
        self._slots = _Slots(self.pool.max_connections // 2 if self.pool else 0)
        self._local = threading.local()

    def execute(self, *args: Any) -> Any:
        """Send one command and return its parsed reply, raising what `execute_command` would."""
        held = self._held()
        connection = held.connection if held else None
        if connection is None:
            return self.client.execute_command(*args)
        self._ready(connection)
        try:
            reply = connection.retry.call_with_retry(
                lambda: self._round_trip(connection, held.pack(args)), lambda error: connection.disconnect()
            )
        except redis.ResponseError:
            raise  # the error was the reply: the connection has read it, and is ready
        except BaseException:
            connection.disconnect()  # the reply may be half read: start anew at the next call
            raise
        callback = self.client.response_callbacks.get(args[0])  # none for EVALSHA
        return reply if callback is None else callback(reply)

    def _held(self) -> _Held | None:
        """This thread's hold (its connection None when the lane was full), or None for a client
        the lane does not serve."""
        if self.pool is None:
            return None
        held = getattr(self._local, "held", None)
        if held is None or held.pid != os.getpid():
            held = self._local.held = _Held(self.pool, self._slots)
        return held

    @staticmethod
    def _ready(connection: Any) -> None:
        """What the pool's checkout does: connect if need be, and connect anew if the socket has
        something to read (an EOF, or bytes nobody asked for). A server that cannot be reached
        raises here, after the connect's own retries, as a checkout would."""
        connection.connect()  # (redis-py retries a connect by the connection's Retry)
        try:
            if connection.can_read():
                raise redis.ConnectionError("the connection has unread data")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            connection.disconnect()
            connection.connect()

    @staticmethod
    def _round_trip(connection: Any, packed: list[bytes]) -> Any:
        connection.send_packed_command(packed)
        return connection.read_response()

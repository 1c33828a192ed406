"""What every system's tasks run, the same code in each virtualenv (needs redis-py and Django).

A task of any system calls `run(handler, token)`:

- if `token` is set (the latency measure), it pushes "<token> <time.time()>" onto the stamps
  list at once, so the time a task started reaches the driver that waits for it;
- it runs one of the handler bodies: `empty`, `incr` (one Redis INCR on this module's own
  connection), `orm` (`SELECT 1` through Django's connection) or `sleep` (time.sleep(0.005));
- it counts the completion in memory. A thread of each worker process sends the count to
  Redis every 10 ms (INCRBY on the done counter), with the start of the first and the end of
  the last task it counted (per process id, in two hashes): the drain's rate is read from
  those, and no task pays a round trip of its own for being counted.

Keys are under BENCH_PREFIX on the Redis at BENCH_REDIS_URL, which the systems queue on too. The
counts and the stamps use BENCH_REPORT_REDIS_URL and the `incr` body BENCH_HANDLER_REDIS_URL where
they are set (bench/peers.py --rtt: the same Redis, straight or through the delay proxy).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import redis

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The counts and the stamps: the measurement's own traffic, never across the simulated network.
REPORT_REDIS_URL = os.environ.get("BENCH_REPORT_REDIS_URL") or REDIS_URL
#: The `incr` body's own I/O.
HANDLER_REDIS_URL = os.environ.get("BENCH_HANDLER_REDIS_URL") or REDIS_URL
PREFIX = os.environ.get("BENCH_PREFIX", "peersbench")
DONE_KEY = f"{PREFIX}:done"
FIRST_KEY = f"{PREFIX}:first"
LAST_KEY = f"{PREFIX}:last"
STAMPS_KEY = f"{PREFIX}:stamps"
INCR_KEY = f"{PREFIX}:incr"
#: Seconds between two reports of a worker process's completions.
FLUSH_INTERVAL = 0.01
SLEEP_SECONDS = 0.005

_clients_lock = threading.Lock()
_clients: dict[str, tuple[int, redis.Redis]] = {}


def client_of(url: str) -> redis.Redis:
    """This process's own Redis client of `url` (a new one after a fork)."""
    with _clients_lock:
        known = _clients.get(url)
        if known is None or known[0] != os.getpid():
            known = _clients[url] = (os.getpid(), redis.Redis.from_url(url))
        return known[1]


def client() -> redis.Redis:
    """The client of the counts and the stamps."""
    return client_of(REPORT_REDIS_URL)


def handler_client() -> redis.Redis:
    """The client of the `incr` body (the same as client() unless they have different URLs)."""
    return client_of(HANDLER_REDIS_URL)


def setup_django(settings: str = "bench.peers.settings") -> None:
    """Set Django up for the ORM handler (a peer's task module calls this as it is imported)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    import django

    django.setup()


def body_empty() -> None:
    pass


def body_incr() -> None:
    handler_client().incr(INCR_KEY)


def body_orm() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def body_sleep() -> None:
    time.sleep(SLEEP_SECONDS)


BODIES: dict[str, Callable[[], None]] = {
    "empty": body_empty,
    "incr": body_incr,
    "orm": body_orm,
    "sleep": body_sleep,
}
HANDLERS = tuple(BODIES)


class Completions:
    """Counts the tasks this process finished; a thread reports them every FLUSH_INTERVAL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._count = 0
        self._first = 0.0
        self._last = 0.0

    def add(self, started: float) -> None:
        now = time.time()
        with self._lock:
            if self._pid != os.getpid():  # first task of this process (or of a forked child)
                self._pid = os.getpid()
                self._count, self._first, self._last = 0, 0.0, 0.0
                threading.Thread(target=self._report_forever, name="bench-completions", daemon=True).start()
            self._count += 1
            self._first = min(self._first, started) if self._first else started
            self._last = max(self._last, now)

    def _report_forever(self) -> None:
        pid = os.getpid()
        while True:
            time.sleep(FLUSH_INTERVAL)
            with self._lock:
                count, first, last = self._count, self._first, self._last
                self._count, self._first = 0, 0.0
            if not count:
                continue
            pipe = client().pipeline(transaction=False)
            pipe.hsetnx(FIRST_KEY, str(pid), repr(first))  # the earliest report of the run wins
            pipe.hset(LAST_KEY, str(pid), repr(last))
            pipe.incrby(DONE_KEY, count)  # last: once the count is reached, the times are there
            pipe.execute()


completions = Completions()


def run(handler: str, token: str) -> None:
    """The whole of a benchmark task, whichever system runs it."""
    started = time.time()
    if token:
        client().rpush(STAMPS_KEY, f"{token} {started!r}")
    BODIES[handler]()
    completions.add(started)

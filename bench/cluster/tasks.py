"""The task bench/cluster.py drains: an empty body that counts itself, reported every 10 ms."""

from __future__ import annotations

import os
import threading
import time

from django_rtq import task
from django_rtq.conf import get_settings
from django_rtq.connection import redis_client

#: Seconds between two reports of a worker process's completions.
REPORT_INTERVAL = 0.01
STATS_TAG = "{cluster-bench-stats}"


def stats_keys() -> tuple[str, str, str]:
    """The done, first and last hashes (pid -> count, earliest start, latest end)."""
    base = f"{get_settings().KEY_PREFIX}:{STATS_TAG}:"
    return base + "done", base + "first", base + "last"


class Completions:
    """Counts the tasks this process finished; a thread reports them every REPORT_INTERVAL.

    A report is HINCRBY on the done hash (field: the pid), with the start of the process's
    first task (HSETNX: the earliest report wins) and the end of its last one: the drain's
    times are read from those, and no task pays a round trip of its own for being counted.
    The three hashes have a hash tag of their own, so on a cluster they are one slot.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reporter: threading.Thread | None = None
        self._count = 0
        self._first = 0.0
        self._last = 0.0

    def add(self, started: float) -> None:
        ended = time.time()
        with self._lock:
            if self._reporter is None:
                self._reporter = threading.Thread(
                    target=self._report_forever, name="bench-completions", daemon=True
                )
                self._reporter.start()
            self._count += 1
            self._first = min(self._first, started) if self._first else started
            self._last = max(self._last, ended)

    def _report_forever(self) -> None:
        pid = str(os.getpid())
        done_key, first_key, last_key = stats_keys()
        client = redis_client(get_settings().REDIS_URL)
        while True:
            time.sleep(REPORT_INTERVAL)
            with self._lock:
                count, first, last = self._count, self._first, self._last
                self._count, self._first = 0, 0.0
            if not count:
                continue
            pipe = client.pipeline(transaction=False)
            pipe.hsetnx(first_key, pid, repr(first))
            pipe.hset(last_key, pid, repr(last))
            pipe.hincrby(done_key, pid, count)  # last: once the count is reached, the times are there
            pipe.execute()


completions = Completions()


@task
def empty() -> None:
    """Do nothing but be counted."""
    completions.add(time.time())

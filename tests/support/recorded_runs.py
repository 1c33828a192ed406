"""Runs that the test app's handlers record (tests/testapp/tasks.py: run_recorded), and starting
and stopping the real `rtq_worker` processes that run them."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from django_rtq import Operations
from tests.support.polling import wait_for
from tests.testapp import tasks

WORKER_START_TIMEOUT = 30.0
WORKER_STOP_TIMEOUT = 20.0


@dataclass(frozen=True)
class Run:
    """One run of a handler, as it recorded itself; `end` is None for a run that never ended."""

    token: str
    id: str
    task: str
    pid: int
    start: float
    end: float | None


def runs_of(client, name: str) -> list[Run]:
    """The runs recorded on the report list `name`, in the order they started."""
    starts, ends = {}, {}
    for raw in client.lrange(tasks.report_key(name), 0, -1):
        entry = json.loads(raw)
        (starts if entry["event"] == "start" else ends)[entry["run"]] = entry
    runs = [
        Run(
            token=token,
            id=e["id"],
            task=e["task"],
            pid=e["pid"],
            start=e["at"],
            end=ends.get(token, {}).get("at"),
        )
        for token, e in starts.items()
    ]
    return sorted(runs, key=lambda run: run.start)


def ended(client, name: str, ids: int) -> list[Run] | None:
    """The runs of `name`, once runs of `ids` different tasks have ended; else None."""
    runs = runs_of(client, name)
    return runs if len({run.id for run in runs if run.end is not None}) >= ids else None


def start_workers(
    start_worker: Callable[..., subprocess.Popen],
    count: int,
    *args: str,
    registered: Callable[[], list] | None = None,
    **options,
) -> list[subprocess.Popen]:
    """Start `count` worker processes and wait until all have registered."""
    workers = [start_worker(*args, **options) for _ in range(count)]
    live = registered or Operations().workers
    pids = {worker.pid for worker in workers}
    wait_for(
        lambda: pids <= {w["pid"] for w in live()} or any(w.poll() is not None for w in workers),
        timeout=WORKER_START_TIMEOUT,
        message=f"{count} worker processes to register",
    )
    for worker in workers:
        assert worker.poll() is None, worker.stdout.read()
    return workers


def stop_workers(workers: list[subprocess.Popen]) -> None:
    """SIGTERM the workers, and check that each stopped cleanly."""
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=WORKER_STOP_TIMEOUT) == 0, worker.stdout.read()

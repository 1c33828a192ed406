"""The enqueueing side of one system, run by bench/peers.py with that system's own Python:

    <venv>/bin/python -m bench.peers.driver <system>

It imports the system's task module, answers a first line with the versions it runs, then reads
one JSON command a line on stdin ({"action": ..., "args": {...}}) and answers each with one JSON
line on stdout, after the marker REPLY (anything else a library prints is not an answer).
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bench.peers import common

REPLY = "@@bench "
#: The module of each system's tasks and clients.
MODULES = {
    "rtq": "bench.peers.tasks",
    "rtq-django": "bench.peers.tasks",
    "rtq-django-defaults": "bench.peers.tasks",
    "huey": "bench.peers.huey_tasks",
    "dramatiq": "bench.peers.dramatiq_tasks",
    "celery": "bench.peers.celery_tasks",
    "rq": "bench.peers.rq_tasks",
}
#: Tasks a bulk call enqueues at once while filling a queue.
FILL_BATCH = 10_000
LATENCY_TIMEOUT = 10
#: Seconds the first warm-up task may wait: the worker may still be starting.
FIRST_TASK_TIMEOUT = 60


def versions(module: Any) -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in module.DISTRIBUTIONS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def enqueue(client: Any, handler: str, count: int) -> dict[str, Any]:
    """`count` enqueue calls one after the other."""
    start = time.perf_counter()
    for _ in range(count):
        client.enqueue(handler)
    return {"seconds": time.perf_counter() - start}


def bulk(client: Any, handler: str, count: int) -> dict[str, Any]:
    """One bulk call of `count` tasks (building them included), where the library has one."""
    if client.bulk is None:
        return {"seconds": None}
    start = time.perf_counter()
    client.enqueue_many(handler, count)
    return {"seconds": time.perf_counter() - start, "call": client.bulk}


def fill(client: Any, handler: str, count: int) -> dict[str, Any]:
    """Enqueue `count` tasks the fastest way the library has: bulk calls, or one by one."""
    start = time.perf_counter()
    if client.bulk is None:
        for _ in range(count):
            client.enqueue(handler)
    else:
        for first in range(0, count, FILL_BATCH):
            client.enqueue_many(handler, min(FILL_BATCH, count - first))
    return {"seconds": time.perf_counter() - start}


def latency(client: Any, handler: str, count: int, warmup: int, gap: float) -> dict[str, Any]:
    """Enqueue one task at a time, each once the previous has started and `gap` seconds have
    passed; each latency is from before the enqueue call to the task's own time.time()."""
    redis = common.client()
    redis.delete(common.STAMPS_KEY)

    def one(token: str, timeout: int = LATENCY_TIMEOUT) -> float:
        t0 = time.time()
        client.enqueue(handler, token)
        while True:
            reply = redis.blpop([common.STAMPS_KEY], timeout=timeout)
            if reply is None:
                raise RuntimeError(f"latency task {token} did not start within {timeout} s")
            got, stamped = reply[1].decode().split(" ", 1)
            if got == token:  # anything else is a straggler of an earlier task
                return float(stamped) - t0

    for i in range(warmup):
        one(f"w{i}", FIRST_TASK_TIMEOUT if i == 0 else LATENCY_TIMEOUT)
        time.sleep(gap)
    seconds = []
    for i in range(count):
        seconds.append(one(f"t{i}"))
        time.sleep(gap)
    return {"latencies": seconds}


def reset(client: Any) -> dict[str, Any]:
    """After a FLUSHALL: whatever the client must set up again."""
    client.reset()
    return {}


ACTIONS = {"enqueue": enqueue, "bulk": bulk, "fill": fill, "latency": latency, "reset": reset}


def reply(value: dict[str, Any]) -> None:
    sys.stdout.write(REPLY + json.dumps(value) + "\n")
    sys.stdout.flush()


def main() -> int:
    system = sys.argv[1]
    common.setup_django()  # DJANGO_SETTINGS_MODULE is set by bench/peers.py
    module = importlib.import_module(MODULES[system])
    client = module.CLIENTS[system]
    reply({"versions": versions(module), "bulk": client.bulk})
    for line in sys.stdin:
        command = json.loads(line)
        try:
            reply(ACTIONS[command["action"]](client, **command.get("args", {})))
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())

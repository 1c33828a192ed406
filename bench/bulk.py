"""How long actions on a whole state take on a big queue, and how long each call holds. A script, not a test.

Run from the repository root:

    python bench/bulk.py [--tasks 1000000] [--redis-url redis://127.0.0.1:6379/0]

It fills one queue with `--tasks` small pending tasks (prepared messages, enqueued in batches),
prints Redis's memory, then times three actions on whole states as the admin starts them:
delete all pending, archive all pending (after filling the queue again), delete all archived.
Each one starts with `Operations().start_bulk(...)`, the request's path, which works for
`REQUEST_BUDGET` seconds and answers; then the script carries the job on as a worker's bulk
runner does, `bulk.carry_on(..., budget=2.0)` in a loop, and prints each step's time, the
longest step, the whole job's time and its rate. The run uses a fresh key prefix
("rtqbench-<random>") and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

# bench/ is first on sys.path when this runs as a script
from throughput import DEFAULT_REDIS_URL, delete_keys, header, setup_django

QUEUE = "bench"
#: Messages built and enqueued per call while filling.
FILL_BATCH = 10_000
#: Seconds a worker's bulk runner works on a job per pass (see django_rtq/worker/server.py).
RUNNER_BUDGET = 2.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000, help="pending tasks in the queue")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL)
    return parser.parse_args()


def memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def megabytes(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def fill(broker, count: int) -> None:
    """Enqueue `count` pending no-op tasks in batches; print how long it took."""
    from bench.tasks import noop

    building = enqueueing = 0.0
    for first in range(0, count, FILL_BATCH):
        started = time.perf_counter()
        messages = [noop.prepare() for _ in range(min(FILL_BATCH, count - first))]
        built = time.perf_counter()
        broker.enqueue(messages)
        building += built - started
        enqueueing += time.perf_counter() - built
    took = building + enqueueing
    print(
        f"fill: {count:,} pending tasks in {took:.1f} s = {count / took:,.0f} tasks/s "
        f"(building messages {building:.1f} s, enqueueing in batches of {FILL_BATCH:,} {enqueueing:.1f} s)",
        flush=True,
    )


def act_on_whole_state(broker, action, state, label: str) -> None:
    """Start a bulk job the way the admin does, carry it on as a worker does; print the times."""
    from django_rtq import Operations
    from django_rtq.broker import bulk
    from django_rtq.formats import plural
    from django_rtq.operations import REQUEST_BUDGET

    started = time.perf_counter()
    job = Operations().start_bulk(action, QUEUE, [state])
    request = time.perf_counter() - started
    print(
        f"{label}: the request took {request:.2f} s (budget {REQUEST_BUDGET:g} s): "
        f"{job.done:,} of {job.total:,} tasks, {job.pages} pages of {bulk.PAGE}",
        flush=True,
    )
    steps = []
    while not job.finished:
        step_started = time.perf_counter()
        job = bulk.carry_on(broker, QUEUE, job.id, budget=RUNNER_BUDGET)
        steps.append(time.perf_counter() - step_started)
        print(f"{label}: step {len(steps)} {steps[-1]:.2f} s, {job.done:,} done ({job.percent}%)", flush=True)
    took = time.perf_counter() - started
    longest = max(steps, default=0.0)
    print(
        f"{label}: {job.done:,} tasks in {took:.1f} s = {job.done / took:,.0f} tasks/s; "
        f"the request {request:.2f} s, then {plural(len(steps), 'step')} of {RUNNER_BUDGET:g} s budget, "
        f"the longest {longest:.2f} s",
        flush=True,
    )
    print(f"redis: used_memory {megabytes(memory(broker.client))} after {label}", flush=True)


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    setup_django(args.redis_url, prefix)
    from django_rtq import get_broker
    from django_rtq.broker import TaskState, bulk
    from django_rtq.broker.states import Action

    broker = get_broker()
    client = broker.client
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        print(f"{header(client, cores)}; load average {os.getloadavg()[0]:.2f}", flush=True)
        print(f"bench: key prefix {prefix}, queue {QUEUE!r}, pages of {bulk.PAGE}", flush=True)
        before = memory(client)
        fill(broker, args.tasks)
        after = memory(client)
        print(
            f"redis: used_memory {megabytes(after)} after the fill ({megabytes(after - before)} more)",
            flush=True,
        )
        act_on_whole_state(broker, Action.DELETE, TaskState.PENDING, "delete all pending")
        fill(broker, args.tasks)
        act_on_whole_state(broker, Action.ARCHIVE, TaskState.PENDING, "archive all pending")
        act_on_whole_state(broker, Action.DELETE, TaskState.ARCHIVED, "delete all archived")
        return 0
    finally:
        delete_keys(client, prefix + ":*")


if __name__ == "__main__":
    sys.exit(main())

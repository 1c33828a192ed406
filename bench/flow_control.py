"""How exactly flow-control limits hold with several worker processes. A script, not a test.

Run from the repository root:

    python bench/flow_control.py [--rate 20] [--seconds 30] [--max-concurrency 3]
                                 [--task-seconds 0.05] [--concurrency-tasks 300]
                                 [--workers 3] [--concurrency 8]
                                 [--redis-url redis://127.0.0.1:6379/0]

It prints, one line each: for a task type limited to `--rate` starts a second, with enough
tasks to keep it at its limit for `--seconds`, the starts a second measured over that window
against the limit (the ratio, and whether within 5%) and the most starts in any 1 s window; for
a type limited to `--max-concurrency` running at once, tasks of `--task-seconds`, the most
observed running at once and the rate against what the limit allows. The handlers record their
start and end in Redis (bench/tasks.py); every run uses a fresh key prefix and deletes its keys
at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

# bench/ is first on sys.path when this runs as a script
from counting import most_at_once, most_starts_within
from throughput import (
    DEFAULT_REDIS_URL,
    delete_keys,
    header,
    ping_line,
    setup_django,
    start_worker,
    stop_worker,
)

#: Tasks enqueued beyond those the rate allows in the window, so that none runs short.
SPARE_SECONDS = 3
DRAIN_TIMEOUT = 300.0
#: Within this share of the limit, the measured rate counts as the limit.
TOLERANCE = 0.05


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=20, help="the rate limit, starts a second")
    parser.add_argument("--seconds", type=float, default=30.0, help="the window the rate is measured over")
    parser.add_argument("--max-concurrency", type=int, default=3, help="the concurrency limit")
    parser.add_argument("--task-seconds", type=float, default=0.05, help="how long a limited task runs")
    parser.add_argument("--concurrency-tasks", type=int, default=300, help="tasks of the concurrency case")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="threads of each worker process")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL)
    return parser.parse_args()


def start_workers(count: int, concurrency: int, ops) -> list:
    workers = [start_worker(concurrency, ops) for _ in range(count)]
    deadline = time.monotonic() + 30
    while len(ops.workers()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} worker processes did not register within 30 s")
        time.sleep(0.05)
    return workers


def wait_for_runs(client, key: str, count: int) -> list[tuple[float, float]]:
    """Wait until `count` runs recorded their end; return each run's (start, end), by start."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        starts, ends = {}, {}
        for entry in client.lrange(key, 0, -1):
            event, token, at = entry.split(" ")
            (starts if event == "start" else ends)[token] = float(at)
        if len(ends) >= count:
            return sorted((at, ends[token]) for token, at in starts.items() if token in ends)
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(ends)} of {count} limited tasks ran within {DRAIN_TIMEOUT:.0f} s")
        time.sleep(0.2)


def bench_rate(args, client, key: str) -> None:
    from bench.tasks import rate_limited
    from django_rtq import enqueue_many

    count = int(args.rate * (args.seconds + SPARE_SECONDS))
    enqueue_many([rate_limited.prepare() for _ in range(count)])
    starts = [start for start, _ in wait_for_runs(client, key, count)]
    in_window = sum(1 for at in starts if at < starts[0] + args.seconds)
    measured = in_window / args.seconds
    ratio = measured / args.rate
    overall = (len(starts) - 1) / (starts[-1] - starts[0])
    print(
        f"rate limit {args.rate}/s ({args.workers} worker processes x {args.concurrency} threads): "
        f"{in_window} starts in the first {args.seconds:g} s = {measured:.2f}/s, {ratio:.3f} of the limit "
        f"(within {TOLERANCE:.0%}: {'yes' if abs(ratio - 1) <= TOLERANCE else 'NO'}); "
        f"most starts in any 1 s window: {most_starts_within(starts, 1.0)} (limit + burst: {args.rate + 1}); "
        f"all {count} tasks at {overall:.2f} starts/s",
        flush=True,
    )


def bench_concurrency(args, client, key: str) -> None:
    from bench.tasks import concurrency_limited
    from django_rtq import enqueue_many

    count = args.concurrency_tasks
    enqueue_many([concurrency_limited.prepare(args.task_seconds) for _ in range(count)])
    runs = wait_for_runs(client, key, count)
    elapsed = max(end for _, end in runs) - runs[0][0]
    ideal = args.max_concurrency / args.task_seconds
    print(
        f"concurrency limit {args.max_concurrency} ({args.workers} worker processes x {args.concurrency} "
        f"threads, tasks of {args.task_seconds * 1000:g} ms): most running at once {most_at_once(runs)}; "
        f"{count} tasks in {elapsed:.2f} s = {count / elapsed:.1f}/s, {count / elapsed / ideal:.3f} of the "
        f"{ideal:.1f}/s the limit allows",
        flush=True,
    )


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    # Read by bench/tasks.py here and in the worker processes, which declare the limited types.
    os.environ["RTQ_BENCH_FLOW_RATE"] = str(args.rate)
    os.environ["RTQ_BENCH_FLOW_CONCURRENCY"] = str(args.max_concurrency)
    setup_django(args.redis_url, prefix)
    from bench.tasks import flow_runs_key
    from django_rtq import Operations, get_broker

    broker, ops = get_broker(), Operations()
    client = broker.client
    workers = []
    try:
        print(header(client, len(os.sched_getaffinity(0))), flush=True)
        print(ping_line(client, 0.002), flush=True)
        workers = start_workers(args.workers, args.concurrency, ops)
        bench_rate(args, client, flow_runs_key())
        client.delete(flow_runs_key())
        bench_concurrency(args, client, flow_runs_key())
        return 0
    finally:
        for worker in workers:
            stop_worker(worker)
        delete_keys(client, prefix + ":*")


if __name__ == "__main__":
    sys.exit(main())

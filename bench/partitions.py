"""How fair partitions serve a small partition behind a big backlog, and what they cost the task
types that do not use them. A script, not a test.

Run from the repository root:

    python bench/partitions.py [--backlog 10000] [--small 20] [--task-seconds 0.01]
                               [--workers 2] [--concurrency 8] [--drain-tasks 20000]
                               [--drain-concurrency 10] [--repeat 3]
                               [--redis-url redis://127.0.0.1:6379/0]

Fairness: with the queue paused, `--backlog` tasks of partition "big" are enqueued; the workers
(`--workers` processes x `--concurrency` threads) start on them, and once they run at full pace
`--small` tasks of partition "small" are enqueued. The handler sleeps `--task-seconds` (I/O);
the small ones push their end time to Redis. It prints how long after their enqueue the last
of the small ones ended, against the fair-share estimate (the small partition gets half the
threads: small x task time / (threads / 2)) and against the same run without partitions (the
small ones then wait behind the whole backlog), and the whole drain's rate in both. Fair and
FIFO runs alternate, `--repeat` of each; the lines give medians.

Cost: drains of `--drain-tasks` empty tasks (no partition) by one worker process, in turns in a
project without partitioned types and in one with a type with partition limits that is never
enqueued (RTQ_BENCH_PARTITIONED_TYPE=1, bench/tasks.py), so that every claim carries the
limits and reads the claimed tasks' types. Every run uses a fresh key prefix and deletes its
keys at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

# bench/ is first on sys.path when this runs as a script
from flow_control import start_workers
from throughput import (
    DEFAULT_REDIS_URL,
    QUEUE,
    bench_drain,
    delete_keys,
    header,
    ping_line,
    setup_django,
    stop_worker,
)

#: Tasks of the backlog that have to be taken before the small partition comes: the workers
#: then run at full pace, their buffers full.
WARMUP_TASKS = 500
TIMEOUT = 300.0
POLL_INTERVAL = 0.005


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=10000, help="tasks of the big partition")
    parser.add_argument("--small", type=int, default=20, help="tasks of the partition that comes after")
    parser.add_argument("--task-seconds", type=float, default=0.01, help="how long the handler sleeps")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the fairness runs")
    parser.add_argument("--concurrency", type=int, default=8, help="threads of each of them")
    parser.add_argument("--drain-tasks", type=int, default=20000, help="tasks of each cost drain")
    parser.add_argument(
        "--drain-concurrency", type=int, default=10, help="threads of the cost drains' worker"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind; medians are printed")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL)
    return parser.parse_args()


@dataclass(frozen=True)
class FairRun:
    small_seconds: float  # from the small ones' enqueue to the end of the last of them
    backlog_then: int  # the big one's tasks pending as the small ones were enqueued
    backlog_after: int  # ... as the last of the small ones ended (read just after)
    drain_rate: float  # tasks/s of the whole run, backlog and small ones


def wait(condition, what: str):
    deadline = time.monotonic() + TIMEOUT
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {TIMEOUT:.0f} s waiting for {what}")
        time.sleep(POLL_INTERVAL)
    return value


def fair_run(args, broker, *, partitioned: bool) -> FairRun:
    """One run: the backlog, then the small ones, with partitions or (FIFO) without."""
    from bench.tasks import fair_key, fair_sleep
    from django_rtq import enqueue_many

    client, keys = broker.client, broker.queue(QUEUE)
    big, small = ("big", "small") if partitioned else (None, None)
    client.delete(fair_key())
    broker.pause(QUEUE)
    enqueue_many([fair_sleep.prepare(big, args.task_seconds) for _ in range(args.backlog)])
    start = time.perf_counter()
    broker.resume(QUEUE)
    wait(lambda: client.zcard(keys.pending) <= args.backlog - WARMUP_TASKS, "the workers to start")

    enqueued_at = time.time()
    enqueue_many([fair_sleep.prepare(small, args.task_seconds, report=True) for _ in range(args.small)])
    backlog_then = client.zcard(keys.pending) - args.small
    wait(lambda: client.llen(fair_key()) >= args.small, "the small partition's tasks")
    backlog_after = client.zcard(keys.pending)
    ends = [float(entry.split(" ")[1]) for entry in client.lrange(fair_key(), 0, -1)]

    def drained() -> bool:
        pipe = client.pipeline(transaction=False)
        pipe.zcard(keys.pending)
        pipe.zcard(keys.active)
        return sum(pipe.execute()) == 0

    wait(drained, "the drain")
    elapsed = time.perf_counter() - start
    return FairRun(
        small_seconds=max(ends) - enqueued_at,
        backlog_then=backlog_then,
        backlog_after=backlog_after,
        drain_rate=(args.backlog + args.small) / elapsed,
    )


def runs_text(values: list[float], form: str) -> str:
    return ", ".join(format(value, form) for value in values)


def bench_fairness(args, broker, ops) -> None:
    runs: dict[bool, list[FairRun]] = {True: [], False: []}
    workers = start_workers(args.workers, args.concurrency, ops)
    try:
        for _ in range(args.repeat):
            for partitioned in (True, False):
                runs[partitioned].append(fair_run(args, broker, partitioned=partitioned))
    finally:
        for worker in workers:
            stop_worker(worker)
    threads = args.workers * args.concurrency
    estimate = args.small * args.task_seconds / (threads / 2)
    fair, fifo = runs[True], runs[False]
    fair_s = statistics.median(run.small_seconds for run in fair)
    fifo_s = statistics.median(run.small_seconds for run in fifo)
    setup = (
        f"handler: {args.task_seconds * 1000:g} ms sleep; {args.workers} worker processes x "
        f"{args.concurrency} threads; {args.small} tasks enqueued behind a backlog of {args.backlog:,}, "
        f"a median {statistics.median(run.backlog_then for run in fair + fifo):,.0f} still pending then"
    )
    fair_runs = runs_text([run.small_seconds * 1000 for run in fair], ".0f")
    left = statistics.median(run.backlog_after for run in fair)
    print(
        f"partitions, the {args.small} of a second partition: all ended {fair_s * 1000:.0f} ms after "
        f"their enqueue (median of {len(fair)}; runs {fair_runs} ms), {fair_s / estimate:.1f}x the "
        f"fair-share estimate of {estimate * 1000:.0f} ms ({args.small} x {args.task_seconds * 1000:g} ms / "
        f"{threads // 2} threads); the big partition still had a median {left:,.0f} pending then ({setup})",
        flush=True,
    )
    print(
        f"no partitions, the same {args.small} behind the backlog: all ended {fifo_s:.2f} s after their "
        f"enqueue (median of {len(fifo)}; runs {runs_text([r.small_seconds for r in fifo], '.2f')} s), "
        f"{fifo_s / fair_s:.0f}x the partitioned runs' time ({setup})",
        flush=True,
    )
    fair_rate = statistics.median(run.drain_rate for run in fair)
    fifo_rate = statistics.median(run.drain_rate for run in fifo)
    print(
        f"the whole drain of {args.backlog + args.small:,} tasks: {fair_rate:,.0f} tasks/s partitioned, "
        f"{fifo_rate:,.0f} tasks/s without partitions (medians of {len(fair)}; the ideal with "
        f"{threads} threads of {args.task_seconds * 1000:g} ms: {threads / args.task_seconds:,.0f}/s)",
        flush=True,
    )


def bench_cost(args, broker, ops) -> None:
    """Drains of tasks without partitions, in turns without and with a partitioned type."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    workers: list[subprocess.Popen] = []
    try:
        for _ in range(args.repeat):
            for with_type in (False, True):
                os.environ["RTQ_BENCH_PARTITIONED_TYPE"] = "1" if with_type else "0"  # the worker's
                note = "; a partitioned type with limits registered" if with_type else ""
                rates[with_type].append(
                    bench_drain(
                        args.drain_tasks,
                        args.drain_concurrency,
                        broker,
                        ops,
                        workers,
                        mirror=False,
                        note=note,
                    )
                )
                stop_worker(workers.pop())
    finally:
        for worker in workers:
            stop_worker(worker)
        os.environ.pop("RTQ_BENCH_PARTITIONED_TYPE", None)
    without, with_type = (statistics.median(rates[key]) for key in (False, True))
    print(
        f"tasks without partitions (empty handler, 1 worker process x {args.drain_concurrency} threads, "
        f"drains of {args.drain_tasks:,}): {without:,.0f} tasks/s in a project without partitioned types, "
        f"{with_type:,.0f} tasks/s with a type with partition limits registered and never enqueued "
        f"({with_type / without - 1:+.1%}; medians of {args.repeat} alternating runs; runs "
        f"{runs_text(rates[False], ',.0f')} vs {runs_text(rates[True], ',.0f')})",
        flush=True,
    )


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    handle, database = tempfile.mkstemp(prefix="rtqbench-", suffix=".sqlite3")
    os.close(handle)
    os.environ["RTQ_BENCH_DB"] = database
    os.environ["RTQ_BENCH_MIRROR"] = "0"
    setup_django(args.redis_url, prefix)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_rtq import Operations, get_broker

    broker, ops = get_broker(), Operations()
    try:
        print(header(broker.client, len(os.sched_getaffinity(0))), flush=True)
        print(ping_line(broker.client, 0.002), flush=True)
        bench_fairness(args, broker, ops)
        delete_keys(broker.client, broker.keys.queue_prefix(QUEUE) + "*")
        bench_cost(args, broker, ops)
        return 0
    finally:
        delete_keys(broker.client, prefix + ":*")
        os.unlink(database)


if __name__ == "__main__":
    sys.exit(main())

"""How fast workflows run against a real Redis, with one worker process. A script, not a test.

Run from the repository root:

    python bench/workflows.py [--chunks 10000] [--chain 200] [--concurrency 10]
                              [--redis-url redis://127.0.0.1:6379/0]

It prints, one line each: a map/reduce over `--chunks` chunks (one task per chunk, each
result applied to the workflow through a command), and a chain of `--chain` steps (each
step started by a command after the previous one finished: the round trips of one step).
Every run uses a fresh key prefix and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

# bench/ is first on sys.path when this runs as a script
from throughput import (
    DEFAULT_REDIS_URL,
    delete_keys,
    header,
    setup_django,
    start_worker,
    stop_worker,
)

TIMEOUT = 600.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=10_000, help="chunks of the map/reduce")
    parser.add_argument("--chain", type=int, default=200, help="steps of the chain")
    parser.add_argument("--concurrency", type=int, default=10, help="threads of the worker process")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL)
    return parser.parse_args()


def wait_finished(ops, workflow_id: str) -> float:
    """Poll until the workflow has left `waiting`; return when (perf_counter)."""
    from django_rtq.broker import TaskState

    deadline = time.monotonic() + TIMEOUT
    while ops.live_task(workflow_id).state == TaskState.WAITING:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workflow {workflow_id} did not finish within {TIMEOUT:.0f} s")
        time.sleep(0.005)
    return time.perf_counter()


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    setup_django(args.redis_url, prefix)
    from bench.tasks import chunk_sum, chunks, inc, total
    from django_rtq import Operations, get_broker
    from django_rtq.workflows import chain, map_reduce

    broker, ops = get_broker(), Operations()
    worker = start_worker(args.concurrency, ops)
    try:
        print(header(broker.client, len(os.sched_getaffinity(0))), flush=True)
        start = time.perf_counter()
        workflow_id = map_reduce(chunks.s(args.chunks, 1), chunk_sum.s(), total.s(), retention=60).enqueue()
        elapsed = wait_finished(ops, workflow_id) - start
        result = ops.live_task(workflow_id).result
        assert result == sum(range(args.chunks)), result
        print(
            f"map/reduce: {args.chunks} chunks in {elapsed:.2f} s = {args.chunks / elapsed:,.0f} chunks/s "
            f"(1 worker process, concurrency {args.concurrency})",
            flush=True,
        )
        start = time.perf_counter()
        workflow_id = chain(inc.s(0), *[inc.s() for _ in range(args.chain - 1)], retention=60).enqueue()
        elapsed = wait_finished(ops, workflow_id) - start
        assert ops.live_task(workflow_id).result == args.chain
        print(
            f"chain: {args.chain} steps in {elapsed:.2f} s = {elapsed / args.chain * 1000:.1f} ms a step",
            flush=True,
        )
    finally:
        stop_worker(worker)
        delete_keys(broker.client, prefix + ":*")
    return 0


if __name__ == "__main__":
    sys.exit(main())

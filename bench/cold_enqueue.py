"""An enqueue after a pause, as an idle web process sends one: the time until its bytes leave and
until the call returns, with script calls on the script lane (django_rtq/broker/lane.py) and
through redis-py's pool, taking turns call by call. A script, not a test.

Run from the repository root, against a Redis of the run's own:

    python bench/cold_enqueue.py [--calls 3000] [--pause 0.002] [--redis-url redis://127.0.0.1:6379/0]

Each call is one `@task` enqueue (bench/enqueue.py's `noop`) or one `django.tasks` enqueue of the
same function, made `--pause` seconds after the previous one returned: the process sleeps between
calls, as a web worker does between requests, and its code runs from cold caches, several times
slower than back to back. The lane and the pool's way take turns call by call, so that the host's
drift falls on both alike. "Bytes leave" is when redis-py's `send_packed_command` is called; each
figure is the median of the calls (the first 200 of each left out). Keys are under a prefix of the
run's own, deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from enqueue import QUEUE, delete_keys, django_noop, noop, setup_django

WARMUP = 200


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="enqueues of each kind, both ways together")
    parser.add_argument("--pause", type=float, default=0.002, help="seconds between calls")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or "redis://127.0.0.1:6379/0")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-cold-{uuid.uuid4().hex[:10]}"
    setup_django(args.redis_url, prefix, MIRROR=False, OUTBOX=False)
    from django.tasks import task as django_task

    from bench.peers.parts import stamp_sends
    from django_rtq import get_broker, task

    kinds = {"@task": task(noop).enqueue, "django.tasks": django_task(queue_name=QUEUE)(django_noop).enqueue}
    broker = get_broker()
    lane_pool = broker.lane.pool
    if lane_pool is None:
        sys.exit("bench: this client's pool is not one the script lane serves")
    sent_at = stamp_sends()
    try:
        for kind, enqueue in kinds.items():
            enqueue()  # registers the queue, loads the scripts
            figures = {way: ([], []) for way in ("lane", "pool")}
            for i in range(2 * args.calls):
                way = "lane" if i % 2 else "pool"
                broker.lane.pool = lane_pool if way == "lane" else None  # None: execute_command
                time.sleep(args.pause)
                sent_at[0] = 0
                start = time.monotonic_ns()
                enqueue()
                end = time.monotonic_ns()
                if i >= 2 * WARMUP:
                    figures[way][0].append((sent_at[0] - start) / 1000)
                    figures[way][1].append((end - start) / 1000)
            for way, (leave, whole) in figures.items():
                print(
                    f"{kind} enqueue after a {args.pause * 1000:g} ms pause, script call through the {way}: "
                    f"bytes leave after {statistics.median(leave):.0f} µs, returns after "
                    f"{statistics.median(whole):.0f} µs (medians of {len(whole)})"
                )
            delete_keys(broker.client, broker.keys.queue_prefix(QUEUE) + "*")
        return 0
    finally:
        broker.lane.pool = lane_pool
        delete_keys(broker.client, f"{prefix}*")


if __name__ == "__main__":
    sys.exit(main())

"""What snooze holds cost the claim of tasks that do not snooze. A script, not a test.

Run from the repository root:

    python bench/snooze.py [--tasks 20000] [--batch 40] [--rounds 7]
                           [--redis-url redis://127.0.0.1:6379/0]

Each round enqueues `--tasks` tasks of one type with no limit and claims them `--batch` at a
time, timing the claims alone, three ways in turn: with the claim script as it was before
snoozes ("before": it checks only the `held` key to choose its plain path); with the claim script
of this release and no hold in the queue (what every project pays for the feature); and with a
hold on *another* type of the queue in force (every claim then takes the flow-control path, as
it does in a queue with limits). It prints the median of the rounds for each: microseconds a
task claimed, and a claim. Every run uses a fresh key prefix and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
QUEUE = "bench"
TASK = "bench.tasks.noop"
#: How the claim chose its path before snoozes: the same line without the holds key.
WITH_HOLDS = "redis.call('EXISTS', fc.held, fc.holds) > 0"
BEFORE = "redis.call('EXISTS', fc.held) == 1"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks claimed each round and way")
    parser.add_argument("--batch", type=int, default=40, help="tasks a claim takes at most")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the medians are printed")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL)
    return parser.parse_args()


def claim_script_before(current):
    """The claim script as it chose its path before snoozes (a variant of this release's)."""
    assert WITH_HOLDS in current.source, "the claim script changed: update bench/snooze.py"
    source = current.source.replace(WITH_HOLDS, BEFORE)
    return dataclasses.replace(current, source=source, sha=hashlib.sha1(source.encode()).hexdigest())


def delete_keys(client, prefix: str) -> None:
    keys = list(client.scan_iter(f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])


def claim_all(broker, args) -> tuple[float, int]:
    """Enqueue the round's tasks, claim them all; return the seconds the claims took, and how many."""
    from django_rtq.broker import TaskMessage

    now = time.time()
    for start in range(0, args.tasks, 1000):
        count = min(1000, args.tasks - start)
        messages = [
            TaskMessage(id=uuid.uuid4().hex, task=TASK, queue=QUEUE, enqueued_at=now) for _ in range(count)
        ]
        broker.enqueue(messages)
    return timed_claims(broker, args.tasks, args.batch)


def timed_claims(broker, tasks: int, batch: int) -> tuple[float, int]:
    """Claim `tasks` pending tasks of QUEUE, `batch` at a time; return the seconds the claims
    took, and how many claims."""
    spent, claims, claimed = 0.0, 0, 0
    while claimed < tasks:
        t0 = time.perf_counter()
        got = broker.claim(QUEUE, worker_id="bench-worker", limit=batch)
        spent += time.perf_counter() - t0
        claims += 1
        claimed += len(got)
        if not got:
            raise RuntimeError(f"only {claimed} of {tasks} tasks were claimed")
    return spent, claims


def main() -> int:
    args = parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from django_rtq.broker import Broker
    from django_rtq.broker.keys import Keyspace

    client = redis.Redis.from_url(args.redis_url, decode_responses=True)
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    broker = Broker(client, prefix=prefix)
    current = broker.scripts["claim"]
    ways = {
        "before snoozes": {**broker.scripts, "claim": claim_script_before(current)},
        "with snoozes, no hold in the queue": dict(broker.scripts),
        "with a hold on another type in force": dict(broker.scripts),
    }
    holds_key = Keyspace(prefix).queue(QUEUE).holds
    per_task: dict[str, list[float]] = {way: [] for way in ways}
    per_claim: dict[str, list[float]] = {way: [] for way in ways}
    print(f"bench: Redis {client.info('server').get('redis_version', '?')}, key prefix {prefix}", flush=True)
    try:
        for _ in range(args.rounds):
            for way, scripts in ways.items():
                broker.scripts = scripts
                delete_keys(client, prefix)
                if way.startswith("with a hold"):
                    client.hset(holds_key, "bench.tasks.other", int(time.time() * 1000) + 3_600_000)
                spent, claims = claim_all(broker, args)
                per_task[way].append(spent / args.tasks * 1e6)
                per_claim[way].append(spent / claims * 1e6)
        for way in ways:
            print(
                f"claim, {way}: median {statistics.median(per_task[way]):.2f} µs a task, "
                f"{statistics.median(per_claim[way]):.1f} µs a claim of {args.batch} "
                f"(rounds: {', '.join(f'{v:.2f}' for v in per_task[way])} µs a task)",
                flush=True,
            )
        return 0
    finally:
        delete_keys(client, prefix)


if __name__ == "__main__":
    sys.exit(main())

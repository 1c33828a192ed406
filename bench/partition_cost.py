"""What fair partitions cost the enqueue and the claim, of tasks with and without a partition.

Run from the repository root (a script, not a test):

    python bench/partition_cost.py [--tasks 20000] [--batch 40] [--rounds 7] [--before REV]
                                   [--redis-url redis://127.0.0.1:6379/0]

Each round enqueues `--tasks` tasks of one type with no limit (1,000 an enqueue call) and claims
them `--batch` at a time, timing the enqueues and the claims apart, in turns:
- "before partitions": the enqueue and claim scripts of `--before` (by default the parent of the
  commit that added partitions), with the helpers they use, on tasks without a partition;
- "now, no partition in the queue": this tree's scripts, the same tasks: what every project pays;
- "now, the queue has had partitioned tasks": the same, in a queue whose virtual clock runs
  (each claim moves it, drops the lanes it passed and raises `seq`);
- "now, tasks of 100 partitions": every task given one of 100 partitions (each enqueue takes its
  partition's turn; each claim moves the clock).
It prints the median of the rounds for each: µs a task enqueued, µs a task claimed and a claim.
Every run uses a fresh key prefix and deletes its keys at the end.
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

import redis

# bench/ is first on sys.path when this runs as a script
from debounce import git, script_source
from snooze import DEFAULT_REDIS_URL, QUEUE, REPO_ROOT, TASK, delete_keys, timed_claims

PARTITIONS = 100
WAYS = (
    "before partitions",
    "now, no partition in the queue",
    "now, the queue has had partitioned tasks",
    f"now, tasks of {PARTITIONS} partitions",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per round and way")
    parser.add_argument("--batch", type=int, default=40, help="tasks a claim takes at most")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the medians are printed")
    parser.add_argument("--before", default=None, help="the git revision to compare the scripts with")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL)
    return parser.parse_args()


def revision_before_partitions() -> str:
    """The parent of the first commit whose message module knew `partition_weight`."""
    added = git(
        "log", "--reverse", "--format=%H", "-S", "partition_weight", "--", "django_rtq/broker/message.py"
    )
    return added.split()[0] + "^"


def scripts_at(broker, revision: str) -> dict:
    """The broker's scripts, with the enqueue and claim scripts of `revision`."""
    scripts = dict(broker.scripts)
    for name in ("enqueue", "claim"):
        source = script_source(name, revision)
        scripts[name] = dataclasses.replace(
            scripts[name], source=source, sha=hashlib.sha1(source.encode()).hexdigest()
        )
    return scripts


def run_round(broker, args, partitioned: bool) -> tuple[float, float, int]:
    """Enqueue the round's tasks, claim them all; return the seconds the enqueues and the claims
    took, and how many claims."""
    from django_rtq.broker import TaskMessage

    now, enqueue_spent = time.time(), 0.0
    for start in range(0, args.tasks, 1000):
        messages = [
            TaskMessage(
                id=uuid.uuid4().hex,
                task=TASK,
                queue=QUEUE,
                enqueued_at=now,
                partition=f"tenant-{(start + n) % PARTITIONS}" if partitioned else None,
            )
            for n in range(min(1000, args.tasks - start))
        ]
        t0 = time.perf_counter()
        broker.enqueue(messages)
        enqueue_spent += time.perf_counter() - t0
    claim_spent, claims = timed_claims(broker, args.tasks, args.batch)
    return enqueue_spent, claim_spent, claims


def main() -> int:
    args = parse_args()
    sys.path.insert(0, str(REPO_ROOT))
    from django_rtq.broker import Broker

    client = redis.Redis.from_url(args.redis_url, decode_responses=True)
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    broker = Broker(client, prefix=prefix)
    before = args.before or revision_before_partitions()
    scripts = {WAYS[0]: scripts_at(broker, before), **{way: dict(broker.scripts) for way in WAYS[1:]}}
    vclock = broker.queue(QUEUE).vclock
    enqueued: dict[str, list[float]] = {way: [] for way in WAYS}
    per_task: dict[str, list[float]] = {way: [] for way in WAYS}
    per_claim: dict[str, list[float]] = {way: [] for way in WAYS}
    server = client.info("server").get("redis_version", "?")
    print(f"bench: Redis {server}, scripts before partitions from {before}, key prefix {prefix}", flush=True)
    try:
        for round_number in range(args.rounds):
            ways = WAYS if round_number % 2 == 0 else tuple(reversed(WAYS))
            for way in ways:
                broker.scripts = scripts[way]
                delete_keys(client, prefix)
                if way == WAYS[2]:
                    client.set(vclock, 0)
                spent_enqueuing, spent_claiming, claims = run_round(broker, args, partitioned=way == WAYS[3])
                enqueued[way].append(spent_enqueuing / args.tasks * 1e6)
                per_task[way].append(spent_claiming / args.tasks * 1e6)
                per_claim[way].append(spent_claiming / claims * 1e6)
        for way in WAYS:
            print(
                f"{way}: enqueue median {statistics.median(enqueued[way]):.2f} µs a task (batches of 1000); "
                f"claim median {statistics.median(per_task[way]):.2f} µs a task, "
                f"{statistics.median(per_claim[way]):.1f} µs a claim of {args.batch} "
                f"({args.rounds} rounds; claim rounds {', '.join(f'{v:.2f}' for v in per_task[way])})",
                flush=True,
            )
        return 0
    finally:
        delete_keys(client, prefix)


if __name__ == "__main__":
    sys.exit(main())

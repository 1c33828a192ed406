"""How fast a task reaches a waiting process: huey's way (LPUSH to a BRPOP), pub/sub, and django-rtq's
enqueue with its hand-off to an idle worker, each read by a bare redis-py client (no worker).

Run from the repository root (a script, not a test):

    python bench/delivery.py [--tasks 300] [--repeat 3] [--gap 0.002]
                             [--redis-url redis://127.0.0.1:6379/0]

Each case has a receiver process (on every CPU) and sends `--tasks` messages one at a time from
this process, `--gap` seconds apart, each once the previous has arrived. It prints, as medians of
`--repeat` rounds (each round runs every case once, in turn) of per-message medians: when the send
returned and when the receiver had the message, both from just before the send.

- `LPUSH -> BRPOP`: the whole of huey's delivery (its worker blocks in BRPOP).
- `script PUBLISH -> pub/sub`: a two-command script (HSET, PUBLISH) read by a subscriber's
  `get_message`: the mechanics of django-rtq's hand-off.
- `@task enqueue -> hand-off`: `.enqueue()` of a django-rtq task while the receiver is registered
  as an idle worker of the queue: the hand-off it gets is what a worker's fetcher reads.

The difference between the last two is django-rtq's enqueue (its Python and its script); what a
worker then does with the message is timed by instrumenting one (bench/RESULTS.md). Keys are under
a prefix of the run's own, deleted at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from enqueue import QUEUE, noop, setup_django

#: The id under which the receiver of the hand-off case registers as an idle worker.
RECEIVER = "delivery-bench"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks", type=int, default=300, help="messages sent one at a time per case and round"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds; the median of their medians is printed"
    )
    parser.add_argument("--gap", type=float, default=0.002, help="seconds between two messages")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or "redis://127.0.0.1:6379/0")
    return parser.parse_args()


def receive(case: str, url: str, keys: dict[str, str], count: int, ready) -> None:
    """The receiver: take `count` messages the case's way, and push "<message> <time>" on the
    stamps list for each (the message is the sender's start time, or a task id)."""
    import redis

    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    client = redis.Redis.from_url(url, decode_responses=True)
    pubsub = None
    if case == "publish":
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(keys["channel"])
    elif case == "handoff":
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(keys["handoff"])
        client.zadd(keys["idle"], {RECEIVER: 10**13})
    ready.set()
    for _ in range(count):
        if pubsub is None:
            _, data = client.brpop([keys["list"]], timeout=30)
        else:
            message = None
            while message is None:
                message = pubsub.get_message(timeout=1.0)
            data = message["data"]
        arrived = time.time()
        if case == "handoff":
            data = data.split("\n", 1)[0]  # "<id>\n<run>\n<message>": the task's id
            client.zadd(keys["idle"], {RECEIVER: 10**13})  # idle again, for the next one
        client.rpush(keys["stamps"], f"{data} {arrived}")


def run_case(case: str, args: argparse.Namespace, client, keys: dict[str, str], send) -> tuple[float, float]:
    """One round of a case: the medians (µs) of the send's return and of the arrival."""
    client.delete(keys["stamps"], keys["list"])
    ready = multiprocessing.Event()
    receiver = multiprocessing.Process(target=receive, args=(case, args.redis_url, keys, args.tasks, ready))
    receiver.start()
    ready.wait(30)
    time.sleep(0.2)  # its subscription is in place once it reads
    returned, arrived = [], []
    try:
        for _ in range(args.tasks):
            start = time.time()
            token = send(start)
            returned.append(time.time() - start)
            _, stamp = client.blpop([keys["stamps"]], timeout=30)
            got, at = stamp.split()
            if got != token:
                raise RuntimeError(f"{case}: got {got!r}, expected {token!r}")
            arrived.append(float(at) - start)
            time.sleep(args.gap)
    finally:
        receiver.join(30)
    return statistics.median(returned) * 1e6, statistics.median(arrived) * 1e6


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-delivery-{uuid.uuid4().hex[:10]}"
    setup_django(args.redis_url, prefix)
    from django_rtq import get_broker, task

    rtq_noop = task(noop)
    broker = get_broker()
    client = broker.client
    qk = broker.queue(QUEUE)
    keys = {
        "stamps": f"{prefix}:stamps",
        "list": f"{prefix}:list",
        "channel": f"{prefix}:channel",
        "hash": f"{prefix}:hash",
        "handoff": qk.handoff_channel(RECEIVER),
        "idle": qk.idle,
    }
    publish = client.register_script(
        "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return redis.call('PUBLISH', KEYS[2], ARGV[1])"
    )
    body = rtq_noop.prepare().to_json()

    def lpush(start: float) -> str:
        client.lpush(keys["list"], repr(start))
        return repr(start)

    def script_publish(start: float) -> str:
        publish(keys=[keys["hash"], keys["channel"]], args=[repr(start), body])
        return repr(start)

    def enqueue(start: float) -> str:
        return rtq_noop.enqueue().id

    cases = [
        ("LPUSH -> BRPOP (huey's delivery)", "list", lpush),
        ("script PUBLISH -> pub/sub (the hand-off's mechanics)", "publish", script_publish),
        ("@task enqueue -> hand-off to an idle worker", "handoff", enqueue),
    ]
    try:
        rtq_noop.enqueue()  # loads the scripts, registers the queue
        client.delete(qk.pending, qk.msg, qk.state)
        rounds: dict[str, list[tuple[float, float]]] = {what: [] for what, _, _ in cases}
        for _ in range(args.repeat):
            for what, case, send in cases:
                rounds[what].append(run_case(case, args, client, keys, send))
        print(
            f"bench: {args.tasks} messages {args.gap * 1000:g} ms apart per case and round, medians of "
            f"{args.repeat} rounds' medians (µs from just before the send)",
            flush=True,
        )
        for what, results in rounds.items():
            returned = statistics.median(r for r, _ in results)
            arrived = statistics.median(a for _, a in results)
            print(
                f"{what}: the send returns after {returned:.1f} µs, "
                f"the receiver has it after {arrived:.1f} µs"
            )
        return 0
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)


if __name__ == "__main__":
    sys.exit(main())

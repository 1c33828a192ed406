"""Redis's own time a task: the server's µs (INFO commandstats) for enqueueing tasks one by one, and
for a worker draining them (its claims, settles and lease renewals). A script, not a test.

Run from the repository root, against a Redis of the run's own (it resets the server's statistics):

    python bench/redis_time.py [--tasks 5000] [--repeat 5] [--concurrency 8]
                               [--redis-url redis://127.0.0.1:6379/0]

The figures are what Redis spends, whatever the client's machine does: the part of a task's cost
that a single-threaded Redis shares among every worker, and the part of each enqueue's round trip
spent in the server. Each line is the median of `--repeat` runs, with its range. The task is a
`@task` with no arguments and the default options (bench/enqueue.py's `noop`); the worker is an
in-process burst worker with `--concurrency` threads. The hand-off figure is the enqueue an idle
worker's latency pays: before each task, a listener subscribed to a worker's hand-off channel
registers that worker as idle (a `ZADD`, not counted), and the enqueue hands the task to it.
Keys are under a prefix of the run's own, deleted at the end.
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
from enqueue import QUEUE, delete_keys, noop, setup_django

#: What is printed, by figure: the CPU of Redis's main thread, and its time in scripts.
FIGURES = {
    "enqueue cpu": "enqueued one by one, CPU of Redis's main thread",
    "enqueue scripts": "enqueued one by one, in scripts (EVALSHA)",
    "handoff scripts": "enqueued one by one, each handed to an idle worker, in scripts (EVALSHA)",
    "handoff commands": "of that, in the {calls:.0f} commands its script calls, as Redis times each",
    "lpush": "for comparison, one LPUSH of a message of the same size",
    "drain cpu": "drained by one worker of {threads} threads, CPU of Redis's main thread",
    "drain scripts": "drained by one worker of {threads} threads, in scripts (EVALSHA)",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000, help="tasks enqueued, then drained, per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the median is printed")
    parser.add_argument("--concurrency", type=int, default=8, help="threads of the draining worker")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or "redis://127.0.0.1:6379/0")
    return parser.parse_args()


def server_cpu(client) -> float:
    """µs of CPU Redis's main thread has used (user and system: commands, scripts, the network)."""
    cpu = client.info("cpu")
    return (cpu["used_cpu_user_main_thread"] + cpu["used_cpu_sys_main_thread"]) * 1e6


def script_micros(client) -> float:
    """µs Redis spent in scripts (their commands within) since its statistics were reset."""
    return float(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def shown(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} µs ({min(values):.1f}-{max(values):.1f})"


def handoff_micros(broker, task_type, tasks: int) -> tuple[float, float, float]:
    """µs in scripts an enqueue takes that hands its task to an idle worker; of those, µs in the
    commands the script calls, as Redis times each; and how many it calls. The idle worker is
    registered by ZINCRBY (a minute past this host's clock: the server's is the same) and the
    hand-off checked by HMGET, which the script does not call, so that the commands counted are
    the script's own."""
    client, qk = broker.client, broker.queue(QUEUE)
    listener = client.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(qk.handoff_channel("idle-one"))
    outside = {"cmdstat_evalsha", "cmdstat_zincrby", "cmdstat_hmget"}
    try:
        delete_keys(client, broker.keys.queue_prefix(QUEUE) + "*")
        client.config_resetstat()
        for _ in range(tasks):
            # the hand-off took the entry out: this adds it back, at this score
            client.zincrby(qk.idle, int(time.time() * 1000) + 60_000, "idle-one")
            message = task_type.enqueue()
            if client.hmget(qk.owner, [message.id]) != ["idle-one"]:
                raise SystemExit("a task was not handed to the idle worker")
        stats = client.info("commandstats")
        inner = [value for name, value in stats.items() if name not in outside and "config" not in name]
        return (
            script_micros(client) / tasks,
            sum(value["usec"] for value in inner) / tasks,
            sum(value["calls"] for value in inner) / tasks,
        )
    finally:
        listener.close()
        delete_keys(client, broker.keys.queue_prefix(QUEUE) + "*")


def lpush_micros(client, message: str, tasks: int) -> float:
    """µs an LPUSH of `message` takes in Redis (huey's enqueue is one)."""
    key = f"{client.connection_pool.connection_kwargs.get('db', 0)}-lpush-{uuid.uuid4().hex}"
    client.config_resetstat()
    for _ in range(tasks):
        client.lpush(key, message)
    client.delete(key)
    stats = client.info("commandstats").get("cmdstat_lpush", {})
    return float(stats.get("usec", 0)) / tasks


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-rt-{uuid.uuid4().hex[:10]}"
    # what is measured is the queue's own traffic: no mirror of finished tasks, no outbox
    setup_django(args.redis_url, prefix, MIRROR=False, OUTBOX=False)

    from django_rtq import get_broker, task
    from django_rtq.worker.server import Worker

    rtq_noop = task(noop)
    broker = get_broker()
    client = broker.client
    figures: dict[str, list[float]] = {name: [] for name in FIGURES}
    handoff_calls: list[float] = []
    try:
        rtq_noop.enqueue()  # loads the scripts, registers the queue
        for _ in range(args.repeat):
            delete_keys(client, broker.keys.queue_prefix(QUEUE) + "*")
            client.config_resetstat()
            cpu = server_cpu(client)
            for _ in range(args.tasks):
                rtq_noop.enqueue()
            figures["enqueue cpu"].append((server_cpu(client) - cpu) / args.tasks)
            figures["enqueue scripts"].append(script_micros(client) / args.tasks)
            client.config_resetstat()
            cpu = server_cpu(client)
            worker = Worker(
                queues={QUEUE: 1}, concurrency=args.concurrency, burst=True, relay=False, watch_redis=False
            )
            worker.run()
            figures["drain cpu"].append((server_cpu(client) - cpu) / args.tasks)
            figures["drain scripts"].append(script_micros(client) / args.tasks)
            if client.zcard(broker.queue(QUEUE).pending):
                raise SystemExit("the burst worker left pending tasks behind")
            handoff, commands, calls = handoff_micros(broker, rtq_noop, args.tasks)
            figures["handoff scripts"].append(handoff)
            figures["handoff commands"].append(commands)
            handoff_calls.append(calls)
            figures["lpush"].append(lpush_micros(client, rtq_noop.prepare().to_json(), args.tasks))
        for name, what in FIGURES.items():
            what = what.format(threads=args.concurrency, calls=statistics.median(handoff_calls))
            print(f"Redis's own time a task, {what}: {shown(figures[name])}")
        return 0
    finally:
        delete_keys(client, f"{prefix}*")


if __name__ == "__main__":
    sys.exit(main())

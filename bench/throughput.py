"""Throughput and latency of django-rtq against a real Redis. A script, not a test.

Run from the repository root:

    python bench/throughput.py [--tasks 20000] [--latency-tasks 500] [--concurrency 10]
                               [--mirror both|on|off] [--repeat 1]
                               [--redis-url redis://127.0.0.1:6379/0]

It measures, one printed line each: enqueueing one by one, bulk enqueueing, draining a
queue with one worker process (with the ORM mirror of finished tasks off, then on: the
worker writes every finished task to an SQLite file; `--repeat N` alternates the two N
times and prints the median rates, since one drain varies by 10-20% on a shared box), and
the end-to-end latency of single tasks sent to an idle worker. Every run uses a fresh key
prefix ("rtqbench-<random>") and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
QUEUE = "bench"
#: Seconds between two looks at the queue while a worker drains it: often enough for a
#: precise figure, rarely enough not to take CPU from the worker.
POLL_INTERVAL = 0.005
WORKER_START_TIMEOUT = 30.0
WORKER_STOP_TIMEOUT = 20.0
DRAIN_TIMEOUT = 300.0
LATENCY_WARMUP = 20
LATENCY_TIMEOUT = 5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000, help="tasks per throughput measure")
    parser.add_argument("--latency-tasks", type=int, default=500, help="tasks timed one at a time")
    parser.add_argument("--concurrency", type=int, default=10, help="threads of the worker process")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL,
        help="Redis to use",
    )
    parser.add_argument(
        "--mirror",
        choices=["both", "on", "off"],
        default="both",
        help="drain with the ORM mirror of finished tasks off, on, or both (off first)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="drain this many times in each mirror mode, alternating, and print the medians",
    )
    parser.add_argument(
        "--latency-gap",
        type=float,
        default=0.002,
        help="seconds to wait between latency tasks, so that each finds the worker idle",
    )
    return parser.parse_args()


def setup_django(redis_url: str, prefix: str) -> None:
    # `python bench/throughput.py` puts bench/ first on sys.path; the repo root is what we need.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(here)]
    sys.path.insert(0, str(REPO_ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["RTQ_REDIS_URL"] = redis_url
    os.environ["RTQ_BENCH_PREFIX"] = prefix
    import django

    django.setup()


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}" if seconds > 0 else "inf"


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.2f} ms" if ms < 1 else f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
    return ordered[int(rank) - 1]


def delete_keys(client, pattern: str) -> int:
    deleted = 0
    batch: list[str] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += client.delete(*batch)
            batch.clear()
    if batch:
        deleted += client.delete(*batch)
    return deleted


def header(client, cores: int) -> str:
    import django
    import redis

    try:
        import hiredis

        parser = f"hiredis {hiredis.__version__}"
    except ImportError:
        parser = "no hiredis"
    server = client.info("server").get("redis_version", "?")
    return (
        f"bench: Python {platform.python_version()}, Django {django.get_version()}, "
        f"redis-py {redis.__version__} ({parser}), Redis server {server}, {cores} cores"
    )


def ping_line(client, gap: float) -> str:
    """How fast this box does a bare Redis round trip now: the floor under every figure."""
    back_to_back, after_idle = [], []
    for _ in range(200):
        t0 = time.perf_counter()
        client.ping()
        back_to_back.append(time.perf_counter() - t0)
    for _ in range(200):
        time.sleep(gap)
        t0 = time.perf_counter()
        client.ping()
        after_idle.append(time.perf_counter() - t0)
    return (
        f"bench: Redis PING round trip p50 {fmt_ms(percentile(back_to_back, 50))} back to back, "
        f"p50 {fmt_ms(percentile(after_idle, 50))} after {gap * 1000:g} ms idle; "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def bench_enqueue_one_by_one(n: int, broker, clear_queue) -> None:
    from bench.tasks import noop

    noop.enqueue()  # first use: loads the scripts into Redis, registers the queue
    clear_queue()
    start = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    elapsed = time.perf_counter() - start
    print(f"enqueue one-by-one: {n} tasks in {elapsed:.2f} s = {rate(n, elapsed)} tasks/s", flush=True)
    clear_queue()


def bench_enqueue_bulk(n: int, clear_queue) -> None:
    from bench.tasks import noop
    from django_rtq import enqueue_many

    start = time.perf_counter()
    messages = [noop.prepare() for _ in range(n)]
    built = time.perf_counter() - start
    start = time.perf_counter()
    enqueue_many(messages)
    elapsed = time.perf_counter() - start
    print(
        f"enqueue bulk: {n} tasks in {elapsed:.2f} s = {rate(n, elapsed)} tasks/s "
        f"(building messages: {built:.2f} s)",
        flush=True,
    )
    clear_queue()


def start_worker(concurrency: int, ops) -> subprocess.Popen:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "django", "rtq_worker",
        "--queues", QUEUE, "--concurrency", str(concurrency), "--loglevel", "WARNING",
    ]  # fmt: skip
    worker = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while not ops.workers():
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with code {worker.returncode} before registering")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not register within {WORKER_START_TIMEOUT:.0f} s")
        time.sleep(0.05)
    return worker


def stop_worker(worker: subprocess.Popen) -> int | None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(WORKER_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(
                f"the worker did not stop within {WORKER_STOP_TIMEOUT:.0f} s; killing it",
                flush=True,
            )
            worker.kill()
            worker.wait()
    return worker.returncode


def bench_drain(
    n: int, concurrency: int, broker, ops, workers: list, *, mirror: bool, note: str = ""
) -> float:
    """Drain n tasks with a fresh worker process; print and return the rate (tasks/s). `note`
    ends the printed line (what else the run sets up)."""
    from bench.tasks import noop
    from django_rtq import enqueue_many
    from django_rtq.broker.broker import utc_day
    from django_rtq.models import FinishedTask

    qk = broker.queue(QUEUE)
    client = broker.client
    broker.pause(QUEUE)
    FinishedTask.objects.all().delete()
    enqueue_many([noop.prepare() for _ in range(n)])
    os.environ["RTQ_BENCH_MIRROR"] = "1" if mirror else "0"  # read by the worker process
    worker = start_worker(concurrency, ops)
    workers.append(worker)

    def processed_keys() -> list[str]:
        # Every UTC day the drain touches (it may cross midnight).
        return list(dict.fromkeys([qk.processed(start_day), qk.processed(utc_day(time.time()))]))

    start_day = utc_day(time.time())
    baseline = {key: int(client.get(key) or 0) for key in processed_keys()}

    def look() -> tuple[int, int]:
        """One round trip: tasks left (pending + active) and tasks processed since the start."""
        keys = processed_keys()
        pipe = client.pipeline(transaction=False)
        pipe.zcard(qk.pending)
        pipe.zcard(qk.active)
        for key in keys:
            pipe.get(key)
        pending, active, *counts = pipe.execute()
        done = sum(int(c or 0) - baseline.get(key, 0) for key, c in zip(keys, counts, strict=True))
        return pending + active, done

    start = time.perf_counter()
    broker.resume(QUEUE)
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while True:
        left, done = look()
        if left == 0 and done >= n:
            break
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with code {worker.returncode} while draining")
        if time.monotonic() > deadline:
            raise RuntimeError(f"drain timed out: {left} tasks left, {done} processed")
        time.sleep(POLL_INTERVAL)
    elapsed = time.perf_counter() - start
    print(
        f"drain, mirror {'on' if mirror else 'off'}: {n} tasks in {elapsed:.2f} s = {rate(n, elapsed)} "
        f"tasks/s (1 worker process, concurrency {concurrency}{note})",
        flush=True,
    )
    if mirror:
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while (rows := FinishedTask.objects.count()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"mirroring timed out: {rows} of {n} rows written")
            time.sleep(POLL_INTERVAL * 10)
        lag = time.perf_counter() - start - elapsed
        print(f"mirror: all {n} finished tasks in the ORM {lag:.2f} s after the drain ended", flush=True)
    return n / elapsed


def print_drain_medians(rates: dict[bool, list[float]]) -> None:
    """The median rate of each mode and, with both, what the mirror costs the drain."""
    medians = {mirror: statistics.median(values) for mirror, values in rates.items() if values}
    for mirror, median in medians.items():
        print(
            f"drain median, mirror {'on' if mirror else 'off'}: {median:,.0f} tasks/s "
            f"over {len(rates[mirror])} runs",
            flush=True,
        )
    if len(medians) == 2:
        cost = 1 - medians[True] / medians[False]
        print(f"mirror cost: {cost:.1%} of the median drain rate", flush=True)


def bench_latency(m: int, gap: float, broker) -> None:
    from bench.tasks import stamp, stamps_key

    client = broker.client
    key = stamps_key()
    enqueue_calls: list[float] = []

    def one(i: int) -> float:
        token = f"t{i}"
        t0 = time.time()
        stamp.enqueue(token)
        enqueue_calls.append(time.time() - t0)
        while True:
            reply = client.blpop([key], timeout=LATENCY_TIMEOUT)
            if reply is None:
                raise RuntimeError(f"latency task {i} did not run within {LATENCY_TIMEOUT} s")
            got, stamped = reply[1].split(" ", 1)
            if got == token:  # anything else is a straggler of an earlier, timed-out task
                return float(stamped) - t0

    for i in range(LATENCY_WARMUP):
        one(-1 - i)
        time.sleep(gap)
    enqueue_calls.clear()
    latencies = []
    for i in range(m):
        latencies.append(one(i))
        time.sleep(gap)
    print(
        f"latency ({m} tasks, idle worker): p50 {fmt_ms(percentile(latencies, 50))}, "
        f"p90 {fmt_ms(percentile(latencies, 90))}, p99 {fmt_ms(percentile(latencies, 99))}, "
        f"max {fmt_ms(max(latencies))} (mean {fmt_ms(statistics.fmean(latencies))}; "
        f"of which the enqueue call: p50 {fmt_ms(percentile(enqueue_calls, 50))})",
        flush=True,
    )


#: A bare redis-py process that answers each item pushed on `<key>:in` by pushing its
#: time.time() on `<key>:out`: the same path as a `stamp` task, without django-rtq.
ECHO_SOURCE = """
import sys, time, redis
client, key = redis.Redis.from_url(sys.argv[1], decode_responses=True), sys.argv[2]
while True:
    _, token = client.blpop([key + ":in"])
    if token == "stop":
        break
    client.rpush(key + ":out", token + " " + repr(time.time()))
"""


def bench_latency_floor(m: int, gap: float, client, redis_url: str, prefix: str) -> None:
    """The same measure against a bare echo process: what this box allows at best."""
    key = f"{prefix}:bench:echo"
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SOURCE, redis_url, key])
    try:

        def one(i: int) -> float:
            token = f"e{i}"
            t0 = time.time()
            client.rpush(key + ":in", token)
            while True:
                reply = client.blpop([key + ":out"], timeout=LATENCY_TIMEOUT)
                if reply is None:
                    raise RuntimeError(f"the echo process did not answer within {LATENCY_TIMEOUT} s")
                got, stamped = reply[1].split(" ", 1)
                if got == token:
                    return float(stamped) - t0

        for i in range(LATENCY_WARMUP):
            one(-1 - i)
            time.sleep(gap)
        latencies = []
        for i in range(m):
            latencies.append(one(i))
            time.sleep(gap)
        print(
            f"latency floor ({m} round trips via a bare redis-py process): "
            f"p50 {fmt_ms(percentile(latencies, 50))}, p90 {fmt_ms(percentile(latencies, 90))}, "
            f"p99 {fmt_ms(percentile(latencies, 99))}, max {fmt_ms(max(latencies))}",
            flush=True,
        )
    finally:
        client.rpush(key + ":in", "stop")
        try:
            echo.wait(5)
        except subprocess.TimeoutExpired:
            echo.kill()
            echo.wait()


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    handle, database = tempfile.mkstemp(prefix="rtqbench-", suffix=".sqlite3")
    os.close(handle)
    os.environ["RTQ_BENCH_DB"] = database
    setup_django(args.redis_url, prefix)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from django_rtq import Operations, get_broker

    broker = get_broker()
    ops = Operations()
    client = broker.client
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers: list[subprocess.Popen] = []

    def clear_queue() -> None:
        delete_keys(client, broker.keys.queue_prefix(QUEUE) + "*")

    try:
        print(header(client, cores), flush=True)
        print(f"bench: key prefix {prefix}, queue {QUEUE!r}", flush=True)
        print(ping_line(client, args.latency_gap), flush=True)
        bench_enqueue_one_by_one(args.tasks, broker, clear_queue)
        bench_enqueue_bulk(args.tasks, clear_queue)
        modes = {"both": [False, True], "on": [True], "off": [False]}[args.mirror]
        rates: dict[bool, list[float]] = {mirror: [] for mirror in modes}
        for _ in range(args.repeat):
            for mirror in modes:
                if workers:
                    stop_worker(workers.pop())
                rate_ = bench_drain(args.tasks, args.concurrency, broker, ops, workers, mirror=mirror)
                rates[mirror].append(rate_)
        if args.repeat > 1:
            print_drain_medians(rates)
        bench_latency(args.latency_tasks, args.latency_gap, broker)
        bench_latency_floor(args.latency_tasks, args.latency_gap, client, args.redis_url, prefix)
        code = stop_worker(workers.pop())
        if code != 0:
            print(f"the worker exited with code {code}", flush=True)
            return 1
        return 0
    finally:
        for worker in workers:
            stop_worker(worker)
        delete_keys(client, prefix + ":*")
        os.unlink(database)


if __name__ == "__main__":
    sys.exit(main())

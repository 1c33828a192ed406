"""Enqueue cost: one-by-one (`@task` and `django.tasks`), bulk, and Redis bytes per pending task.

Run from the repository root (a script, not a test):

    python bench/enqueue.py [--tasks 20000] [--bulk-tasks 20000] [--memory-tasks 100000]
                            [--repeat 3] [--redis-url redis://127.0.0.1:6379/0]
                            [--huey-python .venv-bench/huey/bin/python]

Each single-enqueue line is the median of `--repeat` runs of `--tasks` calls (with the range);
the runs go in rounds, each measure once a round, and a line's overhead over the floor is the
median of its rounds' differences to the floor: one `EVALSHA` round trip of a one-line
script on the same redis-py connection (issue 29's floor; a `PING` is printed beside it). The
enqueue script's own round trip (`EVALSHA` of enqueue.lua with prepared arguments) shows how much
of that overhead is the script's time in Redis rather than Python. Three more lines bound what
any enqueue of this design costs: an `LPUSH` of the message (the command of huey's enqueue), the
least script that writes a task as django-rtq stores it (LEAST_ENQUEUE), and that script after
building the message. Where huey's virtualenv is (bench/peers.py makes it), huey's own enqueue takes its turn
in every round too, timed in a process of huey's Python on the same CPU, and the run then gives
each enqueue's rate as a multiple of huey's (issue 29's single-enqueue target is 0.9x or more),
the median of the rounds' ratios. Memory is measured with `MEMORY USAGE` of the queue's msg,
state, pending and priority keys, and with `INFO memory` used_memory before and after
(server-wide: other clients of the same Redis add noise). The run uses a key prefix of
its own ("rtqbench-enq-<random>") and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"
HUEY_PYTHON = REPO_ROOT / ".venv-bench" / "huey" / "bin" / "python"
#: Calls each process makes before its first timed run: imports, connections, the script cache.
WARMUP_CALLS = 100


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000, help="tasks enqueued one by one per measure")
    parser.add_argument("--bulk-tasks", type=int, default=20000, help="tasks of one enqueue_many call")
    parser.add_argument(
        "--memory-tasks", type=int, default=100000, help="pending tasks whose memory is measured"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measure; the median is printed")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or "redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--huey-python",
        type=Path,
        default=HUEY_PYTHON,
        help="a Python with huey installed (skipped if absent)",
    )
    parser.add_argument("--huey-child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def setup_django(redis_url: str, prefix: str, **rtq) -> None:
    """Configure Django in-process: django-rtq on `redis_url` under `prefix`, `rtq` over its RTQ."""
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(here)]
    sys.path.insert(0, str(REPO_ROOT))
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench-only",
        USE_TZ=True,
        INSTALLED_APPS=["django_rtq"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        RTQ={
            "REDIS_URL": redis_url,
            "KEY_PREFIX": prefix,
            "QUEUES": {QUEUE: 1},
            "DEFAULT_QUEUE": QUEUE,
            **rtq,
        },
        TASKS={"default": {"BACKEND": "django_rtq.backends.RTQBackend", "QUEUES": [QUEUE]}},
    )
    django.setup()


#: The least a script must do to enqueue a task atomically as django-rtq stores it: refuse a
#: taken id, write the message, give it its place in pending, note its state. No hand-off to an
#: idle worker, no wake-up, no priority, delay, uniqueness or partition: a lower bound.
LEAST_ENQUEUE = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {1, 1} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], 100 * 10000000000000 + redis.call('INCR', KEYS[4]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], 'pending')
return {0}
"""


def noop() -> None:
    """The task enqueued: no arguments, the default options (a small task)."""


def django_noop() -> None:
    """The same as a `django.tasks` task."""


class HueyEnqueue:
    """huey's enqueue (`RedisHuey`, its defaults; bench/peers/huey_tasks.py's `empty`), timed in a
    process of huey's own Python that runs `count` calls each time `run()` asks it to."""

    def __init__(self, python: Path, redis_url: str, count: int) -> None:
        env = {**os.environ, "BENCH_REDIS_URL": redis_url, "PYTHONPATH": str(REPO_ROOT)}
        self.process = subprocess.Popen(
            [str(python), __file__, "--huey-child", "--tasks", str(count), "--redis-url", redis_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.version = self._answer()

    def _answer(self) -> str:
        answer = self.process.stdout.readline().strip()
        if not answer:
            raise RuntimeError(f"huey's process ended (exit code {self.process.wait()})")
        return answer

    def run(self) -> float:
        """Seconds of one run of `count` enqueue calls."""
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return float(self._answer())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def huey_child(count: int) -> int:
    """In huey's Python: answer huey's version, then time `count` enqueues for each line read."""
    from importlib.metadata import version

    from bench.peers.huey_tasks import empty, huey

    for _ in range(WARMUP_CALLS):
        empty()
    print(version("huey"), flush=True)
    try:
        for _ in sys.stdin:
            huey.flush()
            start = time.perf_counter()
            for _ in range(count):
                empty()
            print(time.perf_counter() - start, flush=True)
    finally:
        huey.flush()
    return 0


def delete_keys(client, pattern: str) -> None:
    batch: list[str] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


def median_micros(runs: int, count: int, measure) -> tuple[float, float, float]:
    """`runs` runs of `measure()` (which does `count` things, and returns seconds): the median,
    lowest and highest µs each."""
    micros = sorted(measure() / count * 1e6 for _ in range(runs))
    return statistics.median(micros), micros[0], micros[-1]


def line(what: str, count: int, micros: tuple[float, float, float]) -> str:
    median, low, high = micros
    return (
        f"{what}: {count} calls a run, median {1e6 / median:,.0f}/s = {median:.1f} µs ({low:.1f}-{high:.1f})"
    )


def timed(count: int, call, before=None):
    def measure() -> float:
        if before:
            before()
        start = time.perf_counter()
        for _ in range(count):
            call()
        return time.perf_counter() - start

    return measure


def _evalsha(client, sha: str, keys, argv):
    def call() -> None:
        client.evalsha(sha, len(keys), *keys, *argv)

    return call


def server_micros(client, count: int, call) -> float:
    """Redis's own µs a call of `call` (EVALSHA's usec_per_call in INFO commandstats, reset first:
    a server-wide figure, meant for a private Redis)."""
    client.config_resetstat()
    for _ in range(count):
        call()
    return float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])


def memory_lines(client, broker, task_type, count: int, clear_queue) -> list[str]:
    from django_rtq import enqueue_many

    clear_queue()
    messages = [task_type.prepare() for _ in range(count)]
    qk = broker.queue(QUEUE)
    before = client.info("memory")["used_memory"]
    for start in range(0, count, 10000):
        enqueue_many(messages[start : start + 10000])
    after = client.info("memory")["used_memory"]
    keys = {"msg": qk.msg, "state": qk.state, "pending": qk.pending, "priority": qk.priority}
    usage = {name: client.memory_usage(key, samples=0) or 0 for name, key in keys.items()}
    stored = client.hget(qk.msg, messages[0].id)
    clear_queue()
    return [
        f"memory: {count} pending tasks, INFO used_memory +{after - before:,} B = "
        f"{(after - before) / count:.0f} B/task",
        "memory: MEMORY USAGE per task: "
        + ", ".join(f"{name} {size / count:.0f} B" for name, size in usage.items())
        + f"; together {sum(usage.values()) / count:.0f} B/task",
        f"memory: a task id, {len(messages[0].id)} bytes: {messages[0].id}; "
        f"its stored message, {len(stored)} bytes: {stored}",
    ]


def main() -> int:
    args = parse_args()
    if args.huey_child:
        return huey_child(args.tasks)
    prefix = f"rtqbench-enq-{uuid.uuid4().hex[:10]}"
    setup_django(args.redis_url, prefix)
    import django
    import redis

    try:
        from django.tasks import task as django_task
    except ImportError:  # Django 5.2 with the django-tasks backport
        from django_tasks import task as django_task

    from django_rtq import enqueue_many, get_broker, task
    from django_rtq.message_builder import build_message

    rtq_noop = task(noop)
    dj_noop = django_task(queue_name=QUEUE)(django_noop)
    broker = get_broker()
    client = broker.client

    def clear_queue() -> None:
        delete_keys(client, broker.keys.queue_prefix(QUEUE) + "*")

    try:
        print(
            f"bench: Python {platform.python_version()}, Django {django.get_version()}, redis-py "
            f"{redis.__version__}, Redis {client.info('server')['redis_version']}, "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        rtq_noop.enqueue()  # loads the scripts, registers the queue
        dj_noop.enqueue()
        clear_queue()
        n = args.tasks
        qk = broker.queue(QUEUE)
        one_line = client.script_load("return 1")
        least = client.script_load(LEAST_ENQUEUE)
        least_keys = (qk.msg, qk.state, qk.pending, qk.seq)
        prepared = [rtq_noop.prepare() for _ in range(n)]
        body = prepared[0].to_json()
        script = iter(())

        def fresh_prepared() -> None:
            nonlocal script
            clear_queue()
            script = iter([replace(message, id=f"{message.id}{i}") for i, message in enumerate(prepared)])

        def enqueue_script() -> None:
            broker._run_pipelined([broker._send_call("enqueue", qk, [next(script)], 0, qk.handoff_prefix)])

        def outboxed_script() -> None:
            call = broker._send_call("send_outboxed", qk, [next(script)], 0, qk.handoff_prefix)
            broker._run_each([call])

        def least_script() -> None:
            client.evalsha(least, 4, *least_keys, next(script).id, body)

        def least_built() -> None:
            message = build_message(rtq_noop, (), {})
            client.evalsha(least, 4, *least_keys, message.id, message.to_json())

        # (what, the call, what to do before a run of it); every round runs each once, in turn,
        # so that a change of the machine's pace between rounds moves all of them alike
        floor_what = "EVALSHA floor (a one-line script, the same connection)"
        references = [
            ("PING (redis-py, one connection)", client.ping, None),
            (floor_what, lambda: client.evalsha(one_line, 0), None),
            ("build_message only (no I/O)", lambda: build_message(rtq_noop, (), {}), None),
        ]
        enqueues = [
            (
                "LPUSH of a message (one command, as huey's enqueue)",
                lambda: client.lpush(qk.pending + ":lpush", body),
                clear_queue,
            ),
            ("the least enqueue script (LEAST_ENQUEUE, a prepared task)", least_script, fresh_prepared),
            ("build_message + to_json + the least script", least_built, clear_queue),
            ("enqueue.lua alone (EVALSHA of a prepared task)", enqueue_script, fresh_prepared),
            (
                "send_outboxed.lua alone (the same, as enqueue_on_commit sends it)",
                outboxed_script,
                fresh_prepared,
            ),
            ("enqueue one by one, @task .enqueue()", rtq_noop.enqueue, clear_queue),
            (
                "enqueue one by one, @task .enqueue_on_commit() (autocommit)",
                rtq_noop.enqueue_on_commit,
                clear_queue,
            ),
            ("enqueue one by one, django.tasks .enqueue()", dj_noop.enqueue, clear_queue),
        ]
        timings = [(what, timed(n, call, before)) for what, call, before in references + enqueues]
        huey_what = None
        if args.huey_python.exists():
            huey = HueyEnqueue(args.huey_python, args.redis_url, n)
            huey_what = f"huey's enqueue one by one (huey {huey.version}, RedisHuey, in its own Python)"
            timings.append((huey_what, huey.run))
        else:
            print(f"bench: no huey at {args.huey_python} (bench/peers.py makes it): huey's line left out")
        runs: dict[str, list[float]] = {what: [] for what, _ in timings}
        try:
            for _ in range(args.repeat):
                for what, measure in timings:
                    runs[what].append(measure() / n * 1e6)
        finally:
            if huey_what:
                huey.close()
        floors = runs[floor_what]
        for what, _ in timings:
            micros = sorted(runs[what])
            text = line(what, n, (statistics.median(micros), micros[0], micros[-1]))
            if what != floor_what and "no I/O" not in what:
                over = statistics.median(m - f for m, f in zip(runs[what], floors, strict=True))
                text += f"; {over:+.1f} µs over the EVALSHA floor (median of each round's difference)"
            print(text, flush=True)
        if huey_what:
            hueys = runs[huey_what]
            for what, _, _ in enqueues:
                ratio = statistics.median(h / m for h, m in zip(hueys, runs[what], strict=True))
                print(
                    f"rate as a multiple of huey's (median of the rounds' ratios): {what}: {ratio:.2f}x",
                    flush=True,
                )

        # Redis's own time a script call, as the server counts it (the round trip aside)
        lua = broker.scripts["enqueue"].source
        helpers_only = client.script_load(lua[: lua.index("local q = enqueue_context")] + "\nreturn 1\n")
        _, keys, argv = broker._send_call("enqueue", qk, [prepared[0]], 0, qk.handoff_prefix)
        server = [
            ("a one-line script, no arguments", _evalsha(client, one_line, [], []), None),
            ("a one-line script given enqueue.lua's arguments", _evalsha(client, one_line, keys, argv), None),
            ("enqueue.lua's helpers defined, then return", _evalsha(client, helpers_only, keys, argv), None),
            ("the least enqueue script (LEAST_ENQUEUE)", least_script, fresh_prepared),
            ("enqueue.lua (a prepared task, a queue with pending tasks)", enqueue_script, fresh_prepared),
        ]
        for what, call, before in server:
            if before is not None:
                before()
            print(f"Redis's own time a call, {what}: {server_micros(client, n, call):.1f} µs", flush=True)

        bulk_n = args.bulk_tasks

        def bulk_once() -> float:
            clear_queue()
            messages = [rtq_noop.prepare() for _ in range(bulk_n)]
            start = time.perf_counter()
            enqueue_many(messages)
            return time.perf_counter() - start

        median, low, high = median_micros(args.repeat, bulk_n, bulk_once)
        print(
            f"enqueue bulk, enqueue_many of {bulk_n} prepared messages: median {1e6 / median:,.0f}/s "
            f"= {median:.1f} µs each ({low:.1f}-{high:.1f})",
            flush=True,
        )
        for text in memory_lines(client, broker, rtq_noop, args.memory_tasks, clear_queue):
            print(text, flush=True)
        return 0
    finally:
        delete_keys(client, prefix + ":*")


if __name__ == "__main__":
    sys.exit(main())

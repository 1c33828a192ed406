"""Where a task's latency at an idle worker goes, for django-rtq's `@task`, its `django.tasks` path
and huey: the enqueue's Python until its bytes leave, then Redis and the wake-up until the worker's
Redis client returns the message, then the worker's Python until the handler starts. A script,
not a test.

Run from the repository root, after bench/peers.py has made huey's virtualenv (.venv-bench/huey):

    .venv-test/django6/bin/python bench/latency_parts.py [--tasks 400] [--repeat 3]
                                                         [--redis-url redis://127.0.0.1:6391/0]
                                                         [--systems rtq,rtq-django,huey]

`--systems` may name `rtq-django-quiet` too: `django.tasks` with its logger at WARNING
(bench/peers/rtq_quiet_settings.py), so that Django's receiver of `task_started` builds no log
record before the handler starts.

Each system runs its worker as bench/peers.py does (`rtq_worker`, 8 threads; `huey_consumer -k
thread -w 8`), with bench/peers/parts.py patched in: it notes when the worker has read the
message (django-rtq: redis-py's connection has parsed the hand-off; huey: `Redis.brpop` returns)
and when the handler starts. The driver sends `--tasks` tasks one at a time, each `--gap` after
the previous started, as
bench/peers.py's latency does, and notes when its first command's bytes leave (redis-py's
`send_packed_command`). All stamps are on the monotonic clock the processes share. The systems
take turns, `--repeat` rounds, so that the host's drift falls on each alike; each figure is the
median over a system's tasks of all rounds (the first 50 of each round left out), its rounds'
medians beside it. The Redis is the caller's (`--redis-url`): give it one of its own, on a CPU
of its own (taskset), with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RTQ_PYTHON = REPO_ROOT / ".venv-test" / "django6" / "bin" / "python"
HUEY_BIN = REPO_ROOT / ".venv-bench" / "huey" / "bin"
WARMUP = 50
PARTS = ("before its bytes leave", "Redis and the wake-up", "worker to the handler", "in all")
#: django-rtq's systems: the settings of their driver, and of their worker (the same, with the stamps).
RTQ_SETTINGS = {
    "rtq": ("bench.peers.rtq_settings", "bench.peers.parts_rtq_settings"),
    "rtq-django": ("bench.peers.rtq_settings", "bench.peers.parts_rtq_settings"),
    # django.tasks with its logger at WARNING: Django's receivers then make no log record a task
    "rtq-django-quiet": ("bench.peers.rtq_quiet_settings", "bench.peers.parts_rtq_quiet_settings"),
}
SYSTEMS = (*RTQ_SETTINGS, "huey")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=400, help="latency tasks per system and round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each system once a round")
    parser.add_argument("--gap", type=float, default=0.002, help="seconds between tasks")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6391/0")
    parser.add_argument(
        "--systems", default="rtq,rtq-django,huey", help=f"which of {', '.join(SYSTEMS)} take turns"
    )
    parser.add_argument("--driver", choices=SYSTEMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.systems = tuple(args.systems.split(","))
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    return args


def drive(system: str, tasks: int, gap: float) -> dict[str, list[float]]:
    """In the system's own Python: send the tasks, and read the worker's stamps."""
    from bench.peers import common, parts

    if system == "huey":
        from bench.peers.huey_tasks import TASKS

        send = TASKS["empty"]
    else:
        common.setup_django(RTQ_SETTINGS[system][0])
        from bench.peers.tasks import DJANGO_TASKS, NATIVE

        send = (NATIVE if system == "rtq" else DJANGO_TASKS)["empty"].enqueue
    sent_at = parts.stamp_sends()
    client = common.client()
    client.delete(common.STAMPS_KEY, parts.PARTS_KEY)
    ours = {}
    for i in range(tasks):
        token = f"p{i}"
        sent_at[0] = 0
        start = time.monotonic_ns()
        send(token)
        while client.blpop([common.STAMPS_KEY], timeout=10)[1].decode().split(" ", 1)[0] != token:
            pass
        ours[token] = (start, sent_at[0])
        time.sleep(gap)
    figures: dict[str, list[float]] = {part: [] for part in PARTS}
    for raw in client.lrange(parts.PARTS_KEY, WARMUP, -1):
        token, read_at, started = raw.decode().split()
        start, sent = ours[token]
        for part, micros in zip(
            PARTS,
            (sent - start, int(read_at) - sent, int(started) - int(read_at), int(started) - start),
            strict=True,
        ):
            figures[part].append(micros / 1000)
    return figures


def worker_command(system: str) -> list[str]:
    if system == "huey":
        return [
            str(HUEY_BIN / "huey_consumer"),
            "bench.peers.parts_huey.huey",
            "-k",
            "thread",
            "-w",
            "8",
            "-n",
            "-q",
        ]
    return [str(RTQ_PYTHON), "-m", "django", "rtq_worker", "--queues", "bench", "--concurrency", "8"]


def run_round(system: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, list[float]]:
    python = HUEY_BIN / "python" if system == "huey" else RTQ_PYTHON
    if system != "huey":
        env = {**env, "DJANGO_SETTINGS_MODULE": RTQ_SETTINGS[system][1]}
    worker = subprocess.Popen(worker_command(system), cwd=REPO_ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # the worker's start (a driver's first task waits for it in any case)
        driver = [
            str(python),
            __file__,
            "--driver",
            system,
            "--tasks",
            str(args.tasks),
            "--gap",
            str(args.gap),
        ]
        out = subprocess.run(
            driver, cwd=REPO_ROOT, env=env, check=True, capture_output=True, text=True
        ).stdout
        return json.loads(out)
    finally:
        worker.terminate()
        worker.wait(30)


def main() -> int:
    args = parse_args()
    if args.driver:
        print(json.dumps(drive(args.driver, args.tasks, args.gap)))
        return 0
    if not (HUEY_BIN / "huey_consumer").exists():
        sys.exit("bench: run bench/peers.py --only huey once first: it makes .venv-bench/huey")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "BENCH_REDIS_URL": args.redis_url,
        "BENCH_PREFIX": f"parts{os.getpid()}",
    }
    systems = args.systems
    rounds: dict[str, list[dict[str, list[float]]]] = {system: [] for system in systems}
    for _ in range(args.repeat):
        for system in systems:
            rounds[system].append(run_round(system, args, env))
    print(
        f"bench: latency's parts at an idle worker, handler `empty`, {args.tasks} tasks"
        f" {args.gap * 1000:g} ms "
        f"apart per round, {args.repeat} rounds, Redis at {args.redis_url}; medians in µs (rounds' medians)"
    )
    for system in systems:
        cells = []
        for part in PARTS:
            every = [value for figures in rounds[system] for value in figures[part]]
            each = ", ".join(f"{statistics.median(figures[part]):.0f}" for figures in rounds[system])
            cells.append(f"{part} {statistics.median(every):.0f} ({each})")
        print(f"{system:10}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

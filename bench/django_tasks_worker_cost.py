"""A worker's CPU a task through `django.tasks` against django-rtq's own `@task`, and how much of
the difference is Django's contract. A script, not a test.

Run from the repository root, against a Redis of the run's own (its keys go under a prefix of
the run's own, deleted at the end):

    .venv-test/django6/bin/python bench/django_tasks_worker_cost.py [--tasks 40000] [--repeat 3]
        [--concurrency 8] [--cpu N] [--redis-url redis://127.0.0.1:6379/0]

Each run enqueues `--tasks` tasks of bench/peers.py's `incr` handler (one Redis INCR), then
drains them with a real `manage.py rtq_worker --burst` of `--concurrency` threads pinned to one
CPU (`--cpu`, the last by default; -1 leaves it to the scheduler), and takes the worker's CPU
(user + system) from the kernel's accounting of the finished child. A burst worker that finds
nothing to do is timed the same way, and its start-up subtracted, from the CPU and from the wall
time the drain rate is reckoned on. Four variants, in turn:

- `@task`: django-rtq's own decorator (bench/peers/rtq_settings.py, as `bench/peers.py` runs it);
- `django.tasks`: Django's `@task` run by django-rtq's backend, with Django's default logging;
- the same with the `django.tasks` logger at WARNING (bench/peers/rtq_quiet_settings.py), the
  setting docs/django.md gives: Django's receivers of `task_started` and `task_finished` then
  build no log record;
- the same with Django's part taken out of the runner (bench/peers/without_django_contract.py):
  no `TaskResult`, no `task_started`, no `task_finished`. Not a setting anyone runs, but the
  floor: what the `django.tasks` path costs beyond `@task` once Django's contract is gone.

Each line is the median of `--repeat` runs, with the range; the ratios are of the medians. A
worker pinned to one CPU is bound by that CPU, so the ratio of CPU a task bounds the ratio of
the drain rates (`bench/peers.py` measures those).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"


@dataclass(frozen=True)
class Variant:
    label: str
    settings: str
    client: str  # "rtq" (@task) or "rtq-django" (django.tasks), bench/peers/tasks.py's CLIENTS


VARIANTS = (
    Variant("@task", "bench.peers.rtq_settings", "rtq"),
    Variant("django.tasks", "bench.peers.rtq_settings", "rtq-django"),
    Variant("django.tasks, its logger at WARNING", "bench.peers.rtq_quiet_settings", "rtq-django"),
    Variant("django.tasks without Django's part", "bench.peers.rtq_without_contract_settings", "rtq-django"),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40000, help="tasks drained a run")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant; the median is printed")
    parser.add_argument("--concurrency", type=int, default=8, help="the worker's threads")
    parser.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the worker's CPU")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or "redis://127.0.0.1:6379/0")
    return parser.parse_args()


def worker_seconds(args: argparse.Namespace, variant: Variant, env: dict[str, str]) -> tuple[float, float]:
    """Run a burst worker to the end: the CPU seconds it used (user + system) and its wall time."""
    command = [sys.executable, "-m", "django", "rtq_worker", "--queues", QUEUE, "--loglevel", "WARNING"]
    command += ["--concurrency", str(args.concurrency), "--burst"]
    pin = None if args.cpu < 0 else (lambda: os.sched_setaffinity(0, {args.cpu}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(
        command,
        cwd=REPO_ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": variant.settings},
        preexec_fn=pin,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def shown(values: list[float], unit: str, digits: int = 1) -> str:
    def text(value: float) -> str:
        return f"{value:,.{digits}f}"

    return f"{text(statistics.median(values))}{unit} ({text(min(values))}-{text(max(values))})"


def main() -> None:
    args = parse_args()
    prefix = f"djcost-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "BENCH_REDIS_URL": args.redis_url,
        "BENCH_PREFIX": prefix,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    os.environ.update({key: env[key] for key in ("BENCH_REDIS_URL", "BENCH_PREFIX")})
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.peers.rtq_settings"
    sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()
    from bench.peers.common import INCR_KEY
    from bench.peers.tasks import CLIENTS
    from django_rtq.connection import get_broker

    client = get_broker().client
    cpu: dict[str, list[float]] = {variant.label: [] for variant in VARIANTS}
    rates: dict[str, list[float]] = {variant.label: [] for variant in VARIANTS}
    print(
        f"bench: {args.tasks:,} incr tasks a run, a burst worker of {args.concurrency} threads"
        f" on CPU {args.cpu if args.cpu >= 0 else 'any'}, medians of {args.repeat}",
        flush=True,
    )
    try:
        for _ in range(args.repeat):
            for variant in VARIANTS:  # in turn, so that a slow minute falls on every variant
                idle_cpu, idle_wall = worker_seconds(args, variant, env)
                for _ in range(args.tasks):
                    CLIENTS[variant.client].enqueue("incr")
                done = int(client.get(INCR_KEY) or 0)
                busy_cpu, busy_wall = worker_seconds(args, variant, env)
                if int(client.get(INCR_KEY) or 0) - done != args.tasks:
                    raise RuntimeError(f"{variant.label}: the worker did not run every task once")
                cpu[variant.label].append((busy_cpu - idle_cpu) / args.tasks * 1e6)
                rates[variant.label].append(args.tasks / max(busy_wall - idle_wall, 1e-9))
    finally:
        keys = list(client.scan_iter(f"{prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
    native = statistics.median(cpu[VARIANTS[0].label])
    width = max(len(variant.label) for variant in VARIANTS)
    for variant in VARIANTS:
        median = statistics.median(cpu[variant.label])
        print(
            f"{variant.label:<{width}}  worker CPU a task {shown(cpu[variant.label], ' µs')},"
            f" +{median - native:,.1f} µs over @task; drained {shown(rates[variant.label], '/s', 0)};"
            f" @task's CPU ÷ this = {native / median:.2f}"
        )


if __name__ == "__main__":
    main()

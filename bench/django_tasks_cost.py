"""What running a task through `django.tasks` costs on top of django-rtq's own `@task`, item by item.

Run from the repository root (a script, not a test; no Redis needed):

    python bench/django_tasks_cost.py [--calls 20000] [--repeat 5]

The worker runs a `django.tasks` task through the backend's runner (django_rtq/backends.py):
before the function, the attempt's `TaskResult` (RUNNING) and Django's `task_started`; after it,
once the worker has settled the attempt, the finished `TaskResult` and Django's `task_finished`
(through django-rtq's `task_succeeded`). Each line times one of those steps in one thread, with a
task context set as a worker sets it (a first attempt), as the median of `--repeat` runs of
`--calls` calls, with the range. Django's own receivers of both signals log the task at INFO on
the `django.tasks` logger: each step is timed with the default logging, and again with that
logger at WARNING (what docs/django.md tells users who do not want those lines).

These are the costs of one thread alone, back to back; in a worker they are several times
larger, and bench/django_tasks_worker_cost.py measures them there.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls a run")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measure; the median is printed")
    return parser.parse_args()


def noop(token: str = "") -> None:
    """The task: one string argument, as bench/peers.py's handlers take."""


def median_micros(runs: int, calls: int, call) -> tuple[float, float, float]:
    micros = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        micros.append((time.perf_counter() - start) / calls * 1e6)
    micros.sort()
    return statistics.median(micros), micros[0], micros[-1]


def main() -> int:
    args = parse_args()
    from enqueue import setup_django  # bench/enqueue.py's settings: no Redis is reached here

    setup_django("redis://127.0.0.1:1/0", "rtqbench-djcost")
    import django
    from django.tasks import task as django_task

    from django_rtq import backends, signals
    from django_rtq.broker.claims import ClaimedTask
    from django_rtq.context import TaskContext, set_current_task
    from django_rtq.message_builder import build_message
    from django_rtq.worker.outcome import send_robust

    dj_noop = django_task(queue_name="bench")(noop)
    task_type = dj_noop.rtq_task_type
    message = build_message(task_type, ("",), {})
    now = time.time()
    claimed = ClaimedTask(queue="bench", id=message.id, raw_message=message.to_json(), info={}, run="1")
    context = TaskContext(
        id=message.id, task=message.task, queue="bench", retried=0, max_retries=message.max_retries,
        worker_id="bench-worker", enqueued_at=message.enqueued_at, priority=0, started_at=now,
        info=claimed.info,
    )  # fmt: skip
    set_current_task(context)
    runner = task_type.func

    def attempt() -> None:
        runner("")
        send_robust(signals.task_succeeded, task_type, message=message, result=None)

    print(
        f"bench: Python {sys.version.split()[0]}, Django {django.get_version()}; medians of "
        f"{args.repeat} runs of {args.calls:,} calls, one thread",
        flush=True,
    )
    tasks_logger = logging.getLogger("django.tasks")
    for level in (logging.NOTSET, logging.WARNING):
        tasks_logger.setLevel(level)
        said = "with Django's default logging" if level == logging.NOTSET else "with django.tasks at WARNING"
        bare = median_micros(args.repeat, args.calls, lambda: noop(""))
        result = median_micros(
            args.repeat, args.calls, lambda: backends._running_result(dj_noop, context, [""], {})
        )
        start = median_micros(args.repeat, args.calls, lambda: runner(""))
        whole = median_micros(args.repeat, args.calls, attempt)
        print(f"{said}:", flush=True)
        print(f"  the attempt's contract (runner + task_succeeded): {whole[0] - bare[0]:.1f} µs", flush=True)
        print(f"  start: RUNNING TaskResult, task_started: {start[0] - bare[0]:.1f} µs", flush=True)
        print(f"    of which the RUNNING TaskResult: {result[0]:.1f} µs", flush=True)
        print(f"  finish: finished TaskResult, task_finished: {whole[0] - start[0]:.1f} µs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

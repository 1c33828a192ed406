"""The tasks the benchmarks run."""

import os
import time
import uuid

from django_rtq import get_broker, task
from django_rtq.conf import get_settings


def stamps_key() -> str:
    """The Redis list `stamp` pushes onto: under the run's key prefix, so cleanup finds it."""
    return f"{get_settings().KEY_PREFIX}:bench:stamps"


@task
def noop() -> None:
    """Do nothing: what is measured is the queue's own cost."""


@task
def stamp(token: str) -> None:
    """Push "<token> <time.time()>" onto the run's stamps list, for end-to-end latency."""
    now = time.time()
    get_broker().client.rpush(stamps_key(), f"{token} {now!r}")


@task
def chunks(n: int, size: int) -> list[list[int]]:
    """A map step: 0..n-1 in chunks of `size`."""
    return [list(range(start, min(start + size, n))) for start in range(0, n, size)]


@task
def chunk_sum(chunk: list[int]) -> int:
    return sum(chunk)


@task
def total(values: list[int]) -> int:
    return sum(values)


@task
def inc(value: int) -> int:
    return value + 1


# Flow control (bench/flow_control.py). Declared only in the processes it starts with these
# variables (itself and its workers), so that the other benchmarks measure a project without
# limits. `RTQ_BENCH_FLOW_RATE=20 python bench/throughput.py` measures tasks without limits in a
# project that has a limited type.
FLOW_RATE = os.environ.get("RTQ_BENCH_FLOW_RATE")
FLOW_CONCURRENCY = os.environ.get("RTQ_BENCH_FLOW_CONCURRENCY")


def flow_runs_key() -> str:
    """The Redis list the limited tasks record their runs on, under the run's key prefix."""
    return f"{get_settings().KEY_PREFIX}:bench:flow"


def record_run(seconds: float) -> None:
    """Push "start <token> <time>", sleep `seconds`, push "end <token> <time>"."""
    client, token = get_broker().client, uuid.uuid4().hex
    client.rpush(flow_runs_key(), f"start {token} {time.time()!r}")
    if seconds:
        time.sleep(seconds)
    client.rpush(flow_runs_key(), f"end {token} {time.time()!r}")


if FLOW_RATE:

    @task(rate_limit=f"{FLOW_RATE}/s")
    def rate_limited() -> None:
        record_run(0)


if FLOW_CONCURRENCY:

    @task(max_concurrency=int(FLOW_CONCURRENCY))
    def concurrency_limited(seconds: float) -> None:
        record_run(seconds)


def runs_key() -> str:
    """The Redis list `debounced_record` pushes onto (bench/debounce.py)."""
    return f"{get_settings().KEY_PREFIX}:bench:runs"


def _by_key(key: str, value: int) -> str:
    return f"bench:{key}"


@task(debounce=0.5, debounce_key=_by_key)
def debounced_record(key: str, value: int) -> None:
    """Push "<key> <value>" onto the run's runs list: one per run of a debounced burst."""
    get_broker().client.rpush(runs_key(), f"{key} {value}")


# Fair partitions (bench/partitions.py): a handler that waits on I/O (a sleep) for `seconds`, its
# call's partition being `customer` (None: no partition); a run with `report` pushes
# "<customer> <time.time()>" as it ends. Without limits, its type adds nothing to a claim.


def fair_key() -> str:
    """The Redis list `fair_sleep` reports on, under the run's key prefix."""
    return f"{get_settings().KEY_PREFIX}:bench:fair"


@task(partition_by="customer")
def fair_sleep(customer: str | None, seconds: float, report: bool = False) -> None:
    time.sleep(seconds)
    if report:
        get_broker().client.rpush(fair_key(), f"{customer} {time.time()!r}")


# `RTQ_BENCH_PARTITIONED_TYPE=1`: the project has a type with partition limits that the bench
# never enqueues, so that every claim carries them and reads each task's type; measures what that
# costs the tasks without partitions (bench/partitions.py).
if os.environ.get("RTQ_BENCH_PARTITIONED_TYPE") == "1":

    @task(
        partition_by="customer",
        partition_max_concurrency=2,
        partition_limits={"premium": {"max_concurrency": 5}},
    )
    def partitioned_limited(customer: str) -> None:
        """Never enqueued by the benchmarks."""

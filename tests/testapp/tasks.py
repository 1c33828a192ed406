"""Task types the test suite enqueues. They report what they did through Redis lists."""

import asyncio
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import redis

from django_rtq import NonRetryableError, current_task, task

_client = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            os.environ.get("RTQ_REDIS_URL", "redis://127.0.0.1:6379/0"), decode_responses=True
        )
    return _client


def report_key(name: str) -> str:
    return f"rtqtest-report:{os.environ.get('RTQ_TEST_PREFIX', 'rtqtest')}:{name}"


def report(name: str, value) -> None:
    client().rpush(report_key(name), value)


@task
def noop():
    return None


@task(retention=60)
def add(a, b):
    return a + b


@task(max_retries=0, retention=60)
def divide(a, b, *, digits=None):
    """Archived at once when `b` is 0: a task to edit and run again (tests/test_edit_and_replay.py)."""
    quotient = a / b
    return quotient if digits is None else round(quotient, digits)


@task(max_retries=3)
def flaky(name, failures):
    """Fail `failures` times, then succeed."""
    attempt = client().incr(report_key(f"{name}:attempts"))
    if attempt <= failures:
        raise RuntimeError(f"attempt {attempt} fails")
    report(name, "ok")
    return attempt


@task(max_retries=1, retry_backoff=2, retention=60)
def fails_once(name):
    """Fail the first attempt (retried 2 s later); then report this host's clock."""
    if client().incr(report_key(f"{name}:attempts")) == 1:
        raise RuntimeError("the first attempt fails")
    report(name, time.time())


@task(max_retries=0, retention=60)
def waits(name, seconds):
    """Wait `seconds` on an event, then return. Not with time.sleep, which fails under
    libfaketime with a true monotonic clock (tests/support/faketime.py)."""
    threading.Event().wait(seconds)
    return "waited"


@task
def report_host_clock(name):
    """Report this worker host's wall clock: a test checks the clock it set wrong is wrong."""
    report(name, time.time())


@task(rate_limit="10/s")
def rate_10_on_server_clock(name):
    """Report when it started by the Redis server's clock, whatever this host's clock says."""
    seconds, microseconds = client().time()
    report(name, seconds + microseconds / 1e6)


@task(max_retries=2)
def always_fails(name):
    report(name, "attempt")
    raise ValueError("this task always fails")


@task(max_retries=5)
def refuses(name):
    report(name, "attempt")
    raise NonRetryableError("no point in retrying")


def wait_for_release(name, seconds) -> bool:
    """Report that it started, then wait until `release:<name>` is set (or `seconds` pass)."""
    report(f"{name}:started", "1")
    deadline = time.time() + seconds
    while time.time() < deadline:
        if client().get(report_key(f"release:{name}")):
            report(name, "done")
            return True
        time.sleep(0.01)
    report(name, "gave up")
    return False


@task(max_retries=0)
def block(name, seconds=30.0):
    """Report that it started, then wait until `release:<name>` is set (or `seconds` pass)."""
    return "released" if wait_for_release(name, seconds) else "timeout"


#: The thread pools of `leaves_a_pool_job`, kept so that nothing shuts them down.
_pools = []


@task(max_retries=0)
def leaves_a_pool_job(name, seconds=60.0):
    """Give a thread pool a job that waits as `block` does, and return at once: the pool's
    thread outlives the handler, as a library's pool may."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pool-of-{name}")
    _pools.append(pool)
    pool.submit(wait_for_release, name, seconds)


@task(max_retries=0)
def hold(name, seconds=30.0):
    """Like `block`; on leaving, however it leaves, report the task's state in Redis then."""
    from django_rtq import current_task, get_broker

    me = current_task()
    report(f"{name}:started", "1")
    try:
        deadline = time.time() + seconds
        while time.time() < deadline and not client().get(report_key(f"release:{name}")):
            time.sleep(0.01)
    finally:
        broker = get_broker()
        report(f"{name}:left", broker.client.hget(broker.queue(me.queue).state, me.id) or "gone")


@task(max_retries=0)
def sleep_in_c(name, seconds):
    """Block in one C call (no timeout): nothing interrupts it before it returns."""
    report(f"{name}:started", "1")
    time.sleep(seconds)
    report(name, "woke")


def _broken_backoff(retried, exc):
    raise ZeroDivisionError("a broken backoff")


@task(max_retries=1, retry_backoff=_broken_backoff)
def fails_with_a_broken_backoff(name):
    report(name, "ran")
    raise ValueError("it fails")


class UnprintableError(Exception):
    """A library's error whose __str__ reads an attribute it was never given."""

    def __str__(self):
        return f"{self.code}: {self.detail}"


class UnrepresentableError(Exception):
    """An error whose __repr__ raises."""

    def __repr__(self):
        raise RuntimeError("no repr")


class UnreadableNotesError(Exception):
    """An error whose notes cannot be read: formatting its traceback raises."""

    @property
    def __notes__(self):
        raise RuntimeError("no notes")


#: The odd errors `raises_odd` raises, by what breaks in them.
ODD_ERRORS = {"str": UnprintableError, "repr": UnrepresentableError, "notes": UnreadableNotesError}


@task(max_retries=0)
def raises_odd(name, kind):
    """Report a run, then raise the odd error of `kind` (ODD_ERRORS)."""
    report(f"{name}:ran", "1")
    raise ODD_ERRORS[kind]("odd")


@task(max_retries=0, timeout=0.3)
def spin(name):
    """Run Python code past its timeout."""
    report(f"{name}:started", "1")
    while True:
        time.sleep(0.001)


@task(max_retries=0, timeout=0.3)
def stuck_in_c(name):
    """Block in one C call past its timeout; the slot must be freed all the same."""
    report(f"{name}:started", "1")
    time.sleep(3)
    report(name, "woke")


@task
async def async_add(a, b):
    await asyncio.sleep(0.01)
    return a + b


@task(max_retries=0, timeout=0.3)
async def async_sleep(name):
    report(f"{name}:started", "1")
    await asyncio.sleep(30)


@task
def record(name, value=None):
    report(name, value if value is not None else "1")
    return value


@task
def takes_anything(*args, **kwargs):
    return [args, kwargs]


@task
def record_periodic(name="periodic", value=None):
    """`record` with a default name: a periodic schedule may give no arguments."""
    return record(name, value)


@task(queue="high")
def record_high(name, value):
    report(name, value)


@task(queue="low")
def record_low(name, value):
    report(name, value)


@task(retention=60)
def returns_set():
    return {1, 2}


seen_connections = []


@task
def use_database():
    from django.db import connections

    connection = connections["default"]  # this thread's own wrapper, not the proxy
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        (value,) = cursor.fetchone()
    seen_connections.append(connection)
    return value


@task(max_retries=2, retention=60)
def knows_itself():
    """Fail until the last retry, returning what current_task() tells."""
    from django_rtq import current_task

    context = current_task()
    if context.retried < context.max_retries:
        raise RuntimeError("not yet")
    return {"id": context.id, "task": context.task, "queue": context.queue, "retried": context.retried}


@task(retention=60)
async def knows_itself_async():
    from django_rtq import current_task

    return current_task().id


@task
def record_tick(name):
    """Report the id of the task running it: a periodic task's id names its schedule and tick."""
    from django_rtq import current_task

    report(name, current_task().id)


if os.environ.get("RTQ_TEST_PERIODIC_EVERY"):
    # Declared only in the worker processes tests/test_periodic.py starts with this variable.

    @task(every=float(os.environ["RTQ_TEST_PERIODIC_EVERY"]))
    def every_tick():
        from django_rtq import current_task

        report("every_tick", current_task().id)


# Flow control with real worker processes (tests/test_flow_control_workers.py): limited task
# types whose runs record their start and end, for a test to count starts per second and runs
# at once. They go to the default queue, of each test's own key prefix.

#: How many runs of `flow_per_deploy` a deploy lets run at once: each "deploy" sets its own.
FLOW_DEPLOY_CONCURRENCY = int(os.environ.get("RTQ_TEST_FLOW_DEPLOY_CONCURRENCY", "1"))
#: How long a run that waits for its release waits at most (seconds).
FLOW_RELEASE_TIMEOUT = 30.0

_report_client = None


def report_client() -> redis.Redis:
    """The Redis that flow-control handlers report to: RTQ_TEST_REPORT_URL when the broker is a
    cluster (a plain client cannot use its URL), else the broker's own."""
    global _report_client
    if _report_client is None:
        url = os.environ.get("RTQ_TEST_REPORT_URL")
        _report_client = redis.Redis.from_url(url, decode_responses=True) if url else client()
    return _report_client


def run_recorded(name: str, seconds: float, until_released: bool = False) -> None:
    """Push a JSON record of this run's start, then of its end, on the report list `name`: the
    run's own token, task id and type, worker pid and time. Between them, sleep `seconds`, or with
    `until_released`, wait until `release:<name>` is set."""
    from django_rtq import current_task

    me = current_task()
    run = uuid.uuid4().hex

    def record(event: str) -> None:
        entry = {"event": event, "run": run, "id": me.id, "task": me.task, "pid": os.getpid()}
        report_client().rpush(report_key(name), json.dumps({**entry, "at": time.time()}))

    record("start")
    if until_released:
        deadline = time.time() + FLOW_RELEASE_TIMEOUT
        while time.time() < deadline and not report_client().get(report_key(f"release:{name}")):
            time.sleep(0.01)
    else:
        time.sleep(seconds)
    record("end")


@task(rate_limit="10/s")
def flow_rate_10(name):
    run_recorded(name, 0)


@task(max_concurrency=2)
def flow_two_at_once(name, seconds=0.2, until_released=False):
    run_recorded(name, seconds, until_released)


@task(max_concurrency=1)
def flow_one_at_once(name, seconds=0.2):
    run_recorded(name, seconds)


@task
def flow_unlimited(name, seconds=0.2):
    """No limit of its own: only its queue's, if it has one."""
    run_recorded(name, seconds)


@task(max_concurrency=FLOW_DEPLOY_CONCURRENCY)
def flow_per_deploy(name, seconds=0.2):
    run_recorded(name, seconds)


# Fair partitions with real worker processes (tests/test_partition_workers.py): each call's
# partition is its `customer`; the runs record their start and end as the flow-control ones do.


@task(partition_by="customer")
def fair_by_customer(name, customer, seconds=0.01):
    """Partitioned, without limits: only the turns of its partitions in pending."""
    run_recorded(name, seconds)


@task(partition_by="customer", partition_max_concurrency=2)
def two_at_once_per_customer(name, customer, seconds=0.2):
    run_recorded(name, seconds)


@task(partition_by="customer", partition_limits={"gold": {"weight": 3}})
def weighted_by_customer(name, customer, seconds=0.01):
    """Partitioned, the partition "gold" taking three turns to another's one."""
    run_recorded(name, seconds)


@task(
    partition_by="customer",
    partition_max_concurrency=1,
    partition_limits={"premium": {"max_concurrency": 4}},
)
def one_at_once_per_customer_but_premium(name, customer, seconds=0.2):
    """One run at once per customer, but four for the partition "premium"."""
    run_recorded(name, seconds)


# The workflow tests' task types, imported at start-up with this module, so that a worker process
# knows them. Not dtasks: its Django tasks need the suite's TASKS backend (the chaos suite's
# failover settings have another), and a worker learns their limits as their first tasks come
# (tests/test_flow_control_workers.py::test_djangos_own_task_is_limited_across_workers).
from . import wf_tasks  # noqa: E402, F401


@task
def stored_shape(*args, **kwargs):
    """The task of the stored-format fixtures (tests/data/formats/): reports and returns what it
    was called with and its retries. Its name and signature stay: old fixtures name it."""
    value = {"args": list(args), "kwargs": kwargs, "retried": current_task().retried}
    report(f"stored_shape:{current_task().id}", json.dumps(value, sort_keys=True))
    return value


@task(max_retries=0)
def record_pid(name, value):
    """Report `value` as started, then `value:pid` as done (tests/test_worker_recycling.py)."""
    report(f"{name}:started", value)
    report(name, f"{value}:{os.getpid()}")


_kept: list[bytearray] = []


@task(max_retries=0)
def keeps_memory(name, megabytes):
    """Allocate `megabytes` MB and keep them for the life of the process, as a leak does."""
    block = bytearray(megabytes * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not just reserved
    _kept.append(block)
    from django_rtq.worker.health import resident_mb

    report(name, f"{os.getpid()}:{resident_mb():.1f}")


@task(max_retries=0)
def kills_a_worker_thread(name, thread_name):
    """Raise SystemExit in the worker's thread `thread_name`: not an Exception, so the
    component's loop ends and the thread dies, as a bug in it would kill it."""
    from django_rtq.worker.processor.jobs import raise_in_thread

    [thread] = [thread for thread in threading.enumerate() if thread.name == thread_name]
    raise_in_thread(thread, SystemExit)
    report(name, os.getpid())


@task(max_retries=2, retention=60)
def snoozes_once(name, seconds=0.3):
    """Snooze the first run (no attempt counted); then report the retries counted so far."""
    from django_rtq import Snooze

    if client().incr(report_key(f"{name}:runs")) == 1:
        raise Snooze(seconds)
    report(name, current_task().retried)
    return "woke"


@task(max_retries=2, retention=60)
async def snoozes_once_async(name, seconds=0.3):
    """snoozes_once, as an `async def` handler."""
    from django_rtq import Snooze

    if client().incr(report_key(f"{name}:runs")) == 1:
        raise Snooze(seconds)
    report(name, current_task().retried)
    return "woke"


@task(max_retries=1)
def always_snoozes(name):
    """Snooze every run, at once."""
    from django_rtq import Snooze

    client().incr(report_key(f"{name}:runs"))
    raise Snooze(0)


@task(retention=60)
def calls_api(name, retry_after=0.0):
    """A call to a rate-limited API: with `retry_after`, its first run is answered 429 and
    snoozes, holding its type that long; every other run reports this host's time."""
    from django_rtq import Snooze

    if retry_after and client().incr(report_key(f"{name}:runs")) == 1:
        raise Snooze(retry_after, hold_type=True)
    report(name, time.time())


def _reindex_key(name, value=None):
    return f"reindex:{name}"


@task(debounce=0.5, debounce_key=_reindex_key)
def reindex(name, value=None):
    """Debounced by its first argument only (docs/debounce.md): a burst runs once, with the
    newest value."""
    report(name, value)


@task(debounce=60)
def rebuild(name):
    """Debounced by all its arguments (the default key)."""
    report(name, "rebuilt")


@task(max_retries=1, retention=60)
def counts_with_checkpoints(name, total, fail_at=None, pause=0.0):
    """Count from the saved checkpoint (0 on the first run) to `total`, reporting each number
    under `name` and saving it as the checkpoint; the first attempt fails just after saving
    `fail_at`; sleep `pause` after each number. Each run reports its start under `name:runs`."""
    context = current_task()
    start = context.checkpoint or 0
    report(f"{name}:runs", json.dumps({"checkpoint": context.checkpoint, "retried": context.retried}))
    for number in range(start + 1, total + 1):
        report(name, number)
        context.save_checkpoint(number)
        if number == fail_at and context.retried == 0:
            raise RuntimeError(f"failed after checkpoint {number}")
        time.sleep(pause)
    return total


@task(max_retries=1, retention=60)
def backfills_users(name, batch_size, fail_in_batch=None):
    """Report the pk of every user, by pk in batches (iterate_batches); the first attempt fails
    while handling batch number `fail_in_batch` (1-based), after reporting it."""
    from django.contrib.auth.models import User

    from django_rtq.checkpoints import iterate_batches

    context = current_task()
    report(f"{name}:runs", json.dumps({"checkpoint": context.checkpoint, "retried": context.retried}))
    for number, batch in enumerate(iterate_batches(User.objects.all(), batch_size=batch_size), 1):
        for user in batch:
            report(name, user.pk)
        if number == fail_in_batch and context.retried == 0:
            raise RuntimeError(f"failed in batch {number}")
    return name


@task(max_retries=1)
def saves_one_checkpoint(name, seconds):
    """Save the checkpoint "first" (reporting its start under `name`), then work `seconds` in
    short sleeps without another checkpoint: only the shutdown timeout stops it."""
    context = current_task()
    report(name, json.dumps({"checkpoint": context.checkpoint, "retried": context.retried}))
    context.save_checkpoint("first")
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)

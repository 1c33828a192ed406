"""Periodic tasks: declarations, tick arithmetic, the once-per-tick script, and the scheduler
in one worker, two workers, two worker processes and on a cluster."""

from __future__ import annotations

import random
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from django_rtq import registry, task
from django_rtq.broker import Broker, TaskState
from django_rtq.broker.inspect import Inspector
from django_rtq.conf import RTQSettings
from django_rtq.connection import get_broker
from django_rtq.exceptions import InvalidTask
from django_rtq.periodic import (
    ScheduleEntry,
    get_schedules,
    load_entries,
    parse_periodic_id,
    periodic_task_id,
)
from django_rtq.worker.scheduler import Scheduler
from django_rtq.worker.server import Worker
from tests.support.clock import START_TIME
from tests.support.cluster import Cluster
from tests.support.factories import done
from tests.support.polling import wait_for
from tests.support.runs import reports
from tests.testapp import tasks

RECORD_TICK = "tests.testapp.tasks.record_tick"
RECORD = "tests.testapp.tasks.record_periodic"


def entries(**periodic: dict) -> list[ScheduleEntry]:
    """The schedules of these settings.RTQ["PERIODIC"] entries (and of periodic @tasks)."""
    return load_entries(RTQSettings(PERIODIC=periodic))


def only(**periodic: dict) -> ScheduleEntry:
    [entry] = entries(**periodic)
    return entry


@pytest.fixture
def declare():
    """Register task types for one test, then forget them."""
    names = []

    def register(func=None, **options):
        def wrap(func):
            task_type = task(name=f"tests.periodic.{func.__name__}", **options)(func)
            names.append(task_type.name)
            return task_type

        return wrap(func) if func else wrap

    yield register
    for name in names:
        registry._registry.pop(name, None)


def ticks_of(task_ids: list[str], schedule: str) -> list[int]:
    parsed = [parse_periodic_id(task_id) for task_id in task_ids]
    assert all(p is not None and p[0] == schedule for p in parsed), task_ids
    return [tick for _, tick in parsed]


def assert_one_per_tick(ticks: list[int], step_ms: int) -> None:
    """Each tick once (none twice), and every tick between the first and the last (none missed)."""
    assert len(ticks) == len(set(ticks)), f"a tick ran twice: {sorted(ticks)}"
    ordered = sorted(ticks)
    assert ordered == list(range(ordered[0], ordered[-1] + 1, step_ms)), f"a tick was missed: {ordered}"


# Declarations


def test_a_settings_schedule_is_read_with_its_arguments_and_options():
    [nightly, poll] = entries(
        **{
            "nightly-report": {
                "task": RECORD,
                "cron": "0 3 * * *",
                "args": ["nightly"],
                "kwargs": {"value": "x"},
                "queue": "low",
                "priority": 5,
                "timezone": "UTC",
            },
            "poll": {
                "task": "tests.testapp.tasks.record_high",
                "every": timedelta(seconds=30),
                "args": ["poll", "1"],
            },
        }
    )
    assert (nightly.name, nightly.task_type.name, nightly.cron, nightly.every) == (
        "nightly-report",
        RECORD,
        "0 3 * * *",
        None,
    )
    assert nightly.tz == ZoneInfo("UTC") and nightly.source == "settings"
    message = nightly.message(1_700_000_000_000)
    assert message.id == "periodic:nightly-report:1700000000000"
    assert (message.task, message.queue, message.priority) == (RECORD, "low", 5)
    assert (message.args, message.kwargs) == (["nightly"], {"value": "x"})
    assert (poll.every, poll.cron, poll.queue) == (30.0, None, "high")  # the task type's queue


def test_a_decorated_task_is_a_schedule_named_after_the_task(declare):
    @declare(cron="*/5 * * * *", queue="low")
    def every_five_minutes():
        pass

    @declare(every=timedelta(minutes=1))
    def every_minute():
        pass

    by_name = {entry.name: entry for entry in entries()}
    assert set(by_name) == {every_five_minutes.name, every_minute.name}
    five = by_name[every_five_minutes.name]
    assert (five.cron, five.queue, five.source, five.task_type) == (
        "*/5 * * * *",
        "low",
        "decorator",
        every_five_minutes,
    )
    assert by_name[every_minute.name].every == 60.0
    assert every_minute() is None  # still a plain function when called
    assert every_minute.name in {t.name for t in registry.periodic_task_types()}
    assert registry.get_task_type(RECORD) not in registry.periodic_task_types()


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"task": "no.such.task", "every": 5}, "unknown task 'no.such.task'"),
        ({"every": 5}, "needs 'task'"),
        ({"task": RECORD, "every": 5, "cron": "* * * * *"}, "not both"),
        ({"task": RECORD}, "not neither"),
        ({"task": RECORD, "cron": "61 * * * *"}, "not a valid cron expression"),
        ({"task": RECORD, "cron": "every day"}, "not a valid cron expression"),
        ({"task": RECORD, "every": 0}, "positive number of seconds"),
        ({"task": RECORD, "every": -5}, "positive number of seconds"),
        ({"task": RECORD, "every": timedelta(0)}, "positive number of seconds"),
        ({"task": RECORD, "every": "5"}, "positive number of seconds"),
        ({"task": RECORD, "every": 5, "evry": 5}, "unknown key(s) 'evry'"),
        ({"task": RECORD, "every": 5, "retry_backoff": 1}, "unknown key(s) 'retry_backoff'"),
        ({"task": RECORD, "every": 5, "timezone": "UTC"}, "applies to a 'cron' schedule only"),
        ({"task": RECORD, "cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"task": RECORD, "every": 5, "args": "abc"}, "'args' must be a list"),
        ({"task": RECORD, "every": 5, "kwargs": ["a"]}, "'kwargs' must be a dict"),
        ({"task": RECORD, "every": 5, "priority": 1000}, "priority must be an integer"),
        ({"task": RECORD, "every": 5, "queue": "a b"}, "Queue name 'a b' is invalid"),
        ({"task": RECORD, "every": 5, "args": [object()]}, "must be JSON-serializable"),
        ("not a dict", "must be a dict"),
    ],
)
def test_a_bad_settings_schedule_is_improperly_configured(spec, error):
    with pytest.raises(ImproperlyConfigured) as raised:
        entries(bad=spec)
    assert error in str(raised.value)


@pytest.mark.parametrize("name", ["nightly report", "reports/nightly", "", "é"])
def test_a_schedule_name_must_fit_in_a_task_id(name):
    with pytest.raises(ImproperlyConfigured, match="fit in a task id"):
        entries(**{name: {"task": RECORD, "every": 5}})


def test_a_name_declared_in_settings_and_on_a_task_is_refused(declare):
    duplicate = declare(every=5)(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="declared twice"):
        entries(**{duplicate.name: {"task": RECORD, "every": 5}})


def test_bad_decorator_schedules_are_refused_when_declared(declare):
    def func():
        pass

    with pytest.raises(ImproperlyConfigured, match="not a valid cron expression"):
        declare(cron="* * *")(func)
    with pytest.raises(ImproperlyConfigured, match="not both"):
        declare(cron="* * * * *", every=5)(func)
    with pytest.raises(ImproperlyConfigured, match="positive number"):
        declare(every=-1)(func)
    assert registry.get_task_type("tests.periodic.func") is None


def test_a_schedule_is_not_a_per_call_option():
    with pytest.raises(InvalidTask, match="Unknown option"):
        tasks.record.using(cron="* * * * *")
    with pytest.raises(InvalidTask, match="Unknown option"):
        tasks.record.using(every=5)


def test_periodic_task_ids_name_their_schedule_and_tick():
    assert parse_periodic_id(periodic_task_id("a:b", 1234)) == ("a:b", 1234)
    assert parse_periodic_id("3f2a") is None
    assert parse_periodic_id("periodic:nightly:soon") is None


# Ticks


def test_interval_ticks_are_multiples_of_the_interval():
    entry = only(poll={"task": RECORD, "every": 30})
    assert START_TIME % 30 == 20
    assert entry.latest_tick(START_TIME) == (START_TIME - 20) * 1000
    assert entry.next_tick(START_TIME) == (START_TIME + 10) * 1000
    on_tick = START_TIME + 10
    assert entry.latest_tick(on_tick) == on_tick * 1000  # a tick is due at its instant
    assert entry.next_tick(on_tick) == (on_tick + 30) * 1000


def test_cron_is_read_in_the_project_time_zone_across_dst(settings):
    settings.TIME_ZONE = "Europe/Paris"
    paris = ZoneInfo("Europe/Paris")
    entry = only(nightly={"task": RECORD, "cron": "0 3 * * *"})
    # START_TIME is 2023-11-14 22:13:20 UTC: 03:00 in Paris (CET) was 02:00 UTC.
    assert entry.latest_tick(START_TIME) == datetime(2023, 11, 14, 3, tzinfo=paris).timestamp() * 1000
    assert entry.latest_tick(START_TIME) == datetime(2023, 11, 14, 2, tzinfo=UTC).timestamp() * 1000
    assert entry.next_tick(START_TIME) == datetime(2023, 11, 15, 2, tzinfo=UTC).timestamp() * 1000
    summer = datetime(2023, 7, 1, 12, tzinfo=UTC).timestamp()  # CEST: 03:00 in Paris is 01:00 UTC
    assert entry.latest_tick(summer) == datetime(2023, 7, 1, 1, tzinfo=UTC).timestamp() * 1000

    in_utc = only(nightly={"task": RECORD, "cron": "0 3 * * *", "timezone": "UTC"})
    assert in_utc.latest_tick(START_TIME) == datetime(2023, 11, 14, 3, tzinfo=UTC).timestamp() * 1000


def test_cron_ticks_over_a_dst_change_follow_the_wall_clock():
    def ticks(cron: str, start: datetime, hours: int) -> list[str]:
        entry = only(x={"task": RECORD, "cron": cron, "timezone": "Europe/Paris"})
        seen = sorted({entry.latest_tick(start.timestamp() + minute * 60) for minute in range(hours * 60)})
        return [datetime.fromtimestamp(tick / 1000, UTC).strftime("%d %H:%M") for tick in seen]

    autumn = datetime(2024, 10, 26, 12, tzinfo=UTC)  # clocks go back at 01:00 UTC on the 27th
    assert ticks("30 2 * * *", autumn, 24) == ["26 00:30", "27 00:30", "27 01:30"]  # 02:30 twice
    hourly = ticks("0 * * * *", autumn, 24)
    assert len(hourly) == 24 and hourly[0] == "26 12:00" and hourly[-1] == "27 11:00"  # none lost
    spring = datetime(2024, 3, 30, 12, tzinfo=UTC)  # clocks go forward at 01:00 UTC on the 31st
    assert ticks("30 2 * * *", spring, 24) == ["30 01:30", "31 01:00"]  # 02:30 did not exist: 03:00


def test_a_cron_tick_is_due_at_its_instant():
    entry = only(often={"task": RECORD, "cron": "*/5 * * * *"})
    tick = datetime(2023, 11, 14, 22, 15, tzinfo=UTC).timestamp()
    assert entry.latest_tick(tick - 0.001) == (tick - 300) * 1000
    assert entry.latest_tick(tick) == tick * 1000
    assert entry.next_tick(tick) == (tick + 300) * 1000


# The script: one enqueue per tick


def periodic_message(name: str = "poll", tick_ms: int = 0, **options):
    return tasks.record.using(task_id=periodic_task_id(name, tick_ms), **options).prepare(name)


def enqueue_tick(broker: Broker, tick_ms: int, name: str = "poll", **options) -> str:
    message = periodic_message(name, tick_ms, **options)
    return broker.enqueue_periodic(message, schedule=name, tick_ms=tick_ms)


def pending_ids(broker: Broker, queue: str = "default") -> list[str]:
    return broker.client.zrange(broker.queue(queue).pending, 0, -1)


def test_the_first_tick_arms_then_each_newer_tick_enqueues_once(any_broker):
    assert enqueue_tick(any_broker, 1000) == "armed"
    assert pending_ids(any_broker) == []
    assert enqueue_tick(any_broker, 2000) == "enqueued"
    assert enqueue_tick(any_broker, 2000) == "done"
    assert enqueue_tick(any_broker, 1000) == "done"  # an older tick (a slow clock) is not run
    assert pending_ids(any_broker) == [periodic_task_id("poll", 2000)]
    assert enqueue_tick(any_broker, 5000) == "enqueued"
    assert pending_ids(any_broker) == [periodic_task_id("poll", 2000), periodic_task_id("poll", 5000)]
    assert any_broker.periodic_ticks("default") == {"poll": 5000}
    assert "default" in any_broker.known_queues()


def test_a_tick_whose_task_finished_and_was_deleted_is_not_enqueued_again(any_broker):
    enqueue_tick(any_broker, 1000)
    assert enqueue_tick(any_broker, 2000) == "enqueued"
    [claimed] = any_broker.claim("default", worker_id="w", limit=1)
    any_broker.complete("default", [done(claimed.id, retention=0)], worker_id="w")
    assert Inspector(any_broker).queue_stats("default").size == 0  # retention 0: gone
    assert enqueue_tick(any_broker, 2000) == "done"  # a late worker on the same tick
    assert pending_ids(any_broker) == []


def test_concurrent_calls_for_a_tick_enqueue_once(any_broker):
    enqueue_tick(any_broker, 1000)
    callers = 8
    barrier = threading.Barrier(callers)

    def call(_):
        barrier.wait(5)
        return enqueue_tick(any_broker, 2000)

    with ThreadPoolExecutor(callers) as pool:
        outcomes = list(pool.map(call, range(callers)))
    assert sorted(outcomes) == ["done"] * (callers - 1) + ["enqueued"]
    assert pending_ids(any_broker) == [periodic_task_id("poll", 2000)]


def test_a_tick_whose_task_is_still_live_is_recorded_and_skipped(any_broker):
    enqueue_tick(any_broker, 0)
    assert enqueue_tick(any_broker, 1000) == "enqueued"
    # The record was lost (say, deleted by hand) while the task is still pending: no second one.
    any_broker.client.delete(any_broker.queue("default").periodic)
    assert enqueue_tick(any_broker, 0) == "armed"
    assert (
        any_broker.enqueue_periodic(periodic_message("poll", 1000), schedule="poll", tick_ms=1000) == "exists"
    )
    assert pending_ids(any_broker) == [periodic_task_id("poll", 1000)]

    # A unique task whose previous run still holds the lock skips the tick.
    assert enqueue_tick(any_broker, 0, name="solo", unique=True) == "armed"
    assert enqueue_tick(any_broker, 1000, name="solo", unique=True) == "enqueued"
    assert enqueue_tick(any_broker, 2000, name="solo", unique=True) == "locked"
    assert any_broker.periodic_ticks("default")["solo"] == 2000
    assert periodic_task_id("solo", 2000) not in pending_ids(any_broker)


def test_a_periodic_task_due_on_an_idle_queue_is_handed_to_an_idle_worker(broker):
    queue = broker.queue("default")
    broker.claim("default", worker_id="idle-worker", limit=1, idle_for_ms=30_000)
    subscriber = broker.client.pubsub()
    subscriber.subscribe(queue.handoff_channel("idle-worker"))
    wait_for(lambda: subscriber.get_message(timeout=0.1))  # the subscription confirmation
    enqueue_tick(broker, 0)
    assert enqueue_tick(broker, 1000) == "enqueued"
    handed = wait_for(lambda: subscriber.get_message(timeout=0.1))
    subscriber.close()
    assert handed["data"].startswith(periodic_task_id("poll", 1000) + "\n")
    assert Inspector(broker).get_task(periodic_task_id("poll", 1000)).state == TaskState.ACTIVE


# The scheduler, on a fake clock


def scheduler(broker: Broker, schedule: list[ScheduleEntry], interval: float = 1.0) -> Scheduler:
    return Scheduler(broker=broker, entries=schedule, interval=interval)


def test_the_scheduler_enqueues_each_tick_once_and_only_the_latest_missed_one(any_broker, clock):
    schedule = entries(poll={"task": RECORD, "every": 60, "args": ["poll"]})
    first, second = scheduler(any_broker, schedule), scheduler(any_broker, schedule)
    assert first.run_once() == 0  # armed
    clock.advance(60)
    assert (first.run_once(), second.run_once()) == (1, 0)
    assert (first.run_once(), second.run_once()) == (0, 0)
    clock.advance(10 * 60)  # no worker ran for ten ticks
    assert (second.run_once(), first.run_once()) == (1, 0)
    latest = (int(clock.now) // 60 * 60) * 1000
    assert ticks_of(pending_ids(any_broker), "poll") == [latest - 10 * 60_000, latest]


def test_two_schedulers_miss_no_tick_and_run_none_twice(any_broker, clock):
    schedule = entries(poll={"task": RECORD, "every": 5, "args": ["poll"]})
    workers = [scheduler(any_broker, schedule), scheduler(any_broker, schedule)]
    rng = random.Random(3)
    start_tick = int(clock.now) // 5 * 5 * 1000
    enqueued = 0
    for _ in range(60):
        clock.advance(rng.uniform(0.5, 4.9))  # less than a tick apart: every tick is seen
        rng.shuffle(workers)
        enqueued += sum(worker.run_once() for worker in workers)
    ticks = ticks_of(pending_ids(any_broker), "poll")
    assert len(ticks) == enqueued > 25
    assert_one_per_tick(ticks, 5000)
    assert min(ticks) == start_tick + 5000  # the first tick after arming
    assert max(ticks) == int(clock.now) // 5 * 5 * 1000


def test_a_cron_schedule_enqueues_at_its_ticks(any_broker, clock, settings):
    settings.TIME_ZONE = "UTC"
    schedule = entries(often={"task": RECORD, "cron": "*/15 * * * *", "args": ["often"]})
    worker = scheduler(any_broker, schedule)
    worker.run_once()  # 22:13:20: arms the 22:00 tick
    clock.now = datetime(2023, 11, 14, 22, 14, 59, tzinfo=UTC).timestamp()
    assert worker.run_once() == 0
    clock.now = datetime(2023, 11, 14, 22, 15, tzinfo=UTC).timestamp()
    assert worker.run_once() == 1
    clock.now = datetime(2023, 11, 14, 22, 29, tzinfo=UTC).timestamp()
    assert worker.run_once() == 0
    clock.now = datetime(2023, 11, 15, 1, 7, tzinfo=UTC).timestamp()  # three hours later
    assert worker.run_once() == 1
    expected = [datetime(2023, 11, 14, 22, 15, tzinfo=UTC), datetime(2023, 11, 15, 1, 0, tzinfo=UTC)]
    assert ticks_of(pending_ids(any_broker), "often") == [int(t.timestamp() * 1000) for t in expected]
    first = Inspector(any_broker).get_task(periodic_task_id("often", int(expected[0].timestamp() * 1000)))
    assert (first.state, first.message.task, first.message.args) == (TaskState.PENDING, RECORD, ["often"])


def test_the_scheduler_sleeps_until_the_next_tick(broker, clock):
    broker.clock = clock
    schedule = entries(
        slow={"task": RECORD, "every": 60}, fast={"task": RECORD, "every": 30}
    )  # at START_TIME the next ticks are 40 s and 10 s away
    worker = scheduler(broker, schedule, interval=100)
    worker.run_once()
    assert worker.interval == pytest.approx(10.002)
    assert scheduler(broker, schedule, interval=1.0).until_next_tick() == 1.0
    assert scheduler(broker, [], interval=3.0).until_next_tick() == 3.0


def test_get_schedules_tells_the_next_run_and_the_last_tick(any_broker, clock, settings, declare):
    declare(every=30)(lambda: None)
    settings.RTQ = {**settings.RTQ, "PERIODIC": {"nightly": {"task": RECORD, "cron": "0 3 * * *"}}}
    settings.TIME_ZONE = "UTC"
    before = {s.name: s for s in get_schedules(any_broker)}
    assert before["nightly"].last_tick is None
    assert before["nightly"].next_run == datetime(2023, 11, 15, 3, tzinfo=UTC)
    assert before["nightly"].timezone == "UTC"

    scheduler(any_broker, load_entries()).run_once()
    after = {s.name: s for s in get_schedules(any_broker)}
    assert after["nightly"].last_tick == datetime(2023, 11, 14, 3, tzinfo=UTC)
    assert set(after) == {"nightly", "tests.periodic.<lambda>"}
    poll = after["tests.periodic.<lambda>"]
    assert (poll.every, poll.cron, poll.source, poll.queue) == (30.0, None, "decorator", "default")
    assert poll.last_tick == datetime.fromtimestamp(int(START_TIME) // 30 * 30, UTC)
    assert poll.next_run == datetime.fromtimestamp(int(START_TIME) // 30 * 30 + 30, UTC)


# Real workers, real time


PERIODIC_TICKS = {"ticks": {"task": RECORD_TICK, "every": 1, "args": ["ticks"]}}


def run_two_workers(brokers: list[Broker], redis_client, queues: dict[str, int], count: int) -> list[int]:
    workers = [Worker(broker=b, queues=queues, concurrency=2) for b in brokers]
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: len(reports(redis_client, "ticks")) >= count, timeout=count + 10)
    finally:
        for worker in workers:
            worker.stop()
    return ticks_of(reports(redis_client, "ticks"), "ticks")


def test_two_workers_enqueue_each_tick_once(prefix, settings, redis_client, redis_url):
    settings.RTQ = {**settings.RTQ, "PERIODIC": PERIODIC_TICKS}
    other = Broker(redis.Redis.from_url(redis_url, decode_responses=True), prefix=prefix)
    ticks = run_two_workers([get_broker(), other], redis_client, {"default": 1}, count=4)
    other.client.close()
    assert_one_per_tick(ticks, 1000)


def test_two_workers_on_a_cluster_enqueue_each_tick_once(
    prefix, settings, redis_client, redis_cluster: Cluster, cluster_broker
):
    periodic = {"ticks": {**PERIODIC_TICKS["ticks"], "queue": "billing"}}
    settings.RTQ = {**settings.RTQ, "PERIODIC": periodic}
    other = Broker(redis_cluster.client(), prefix=cluster_broker.keys.prefix)
    ticks = run_two_workers([cluster_broker, other], redis_client, {"billing": 1}, count=4)
    other.client.close()
    assert_one_per_tick(ticks, 1000)
    assert set(cluster_broker.periodic_ticks("billing")) == {"ticks"}


def test_two_worker_processes_run_each_tick_once_and_miss_none_when_one_stops(
    start_worker, redis_client, broker
):
    every_tick = "tests.testapp.tasks.every_tick"  # declared with @task(every=1) in the workers only
    first = start_worker("--concurrency", "2", RTQ_TEST_PERIODIC_EVERY="1")
    second = start_worker("--concurrency", "2", RTQ_TEST_PERIODIC_EVERY="1")
    wait_for(lambda: len(reports(redis_client, "every_tick")) >= 3, timeout=30)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0, first.stdout.read()
    seen = len(reports(redis_client, "every_tick"))
    wait_for(lambda: len(reports(redis_client, "every_tick")) >= seen + 3, timeout=15)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=20) == 0, second.stdout.read()
    ticks = ticks_of(reports(redis_client, "every_tick"), every_tick)
    assert_one_per_tick(ticks, 1000)
    assert broker.periodic_ticks("default")[every_tick] >= max(ticks)

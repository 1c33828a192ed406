"""docs/celery.md, row by row: each Celery habit's django-rtq counterpart, run for real."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from django_rtq import (
    InvalidArguments,
    NonRetryableError,
    Operations,
    TaskCancelled,
    TaskTimeout,
    current_task,
    task,
)
from django_rtq.broker import TaskState
from django_rtq.management.commands.rtq_worker import Command as WorkerCommand
from django_rtq.testing import capture_tasks, run_eagerly
from django_rtq.workflows import chain, chord, group
from tests.support.commands import run
from tests.support.polling import wait_for
from tests.support.runs import reports, wait_state
from tests.testapp import tasks as testapp_tasks

try:
    from django.tasks import TaskResultStatus
    from django.tasks import task as django_task
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus
    from django_tasks import task as django_task

pytestmark = pytest.mark.django_db(transaction=True)

#: What `record` ran, in order (the workers of these tests run in this process).
ran: list[str] = []
#: Attempts of `fetch_rate`, by name.
attempts: dict[str, int] = {}
#: Set to let `long_report` end.
released = threading.Event()


@pytest.fixture(autouse=True)
def fresh_state():
    ran.clear()
    attempts.clear()
    released.clear()
    yield
    released.set()


@task(retention=60)
def add(a, b):
    return a + b


@task(retention=60)
def mul(a, b):
    return a * b


@task(retention=60)
def total(values):
    return sum(values)


@task(max_retries=0)
def record(label):
    ran.append(label)


@task(queue="low", retention=60)
def resize_image(name):
    return f"resized {name}"


@task(retention=60)
def who_am_i():
    context = current_task()
    return {"id": context.id, "task": context.task, "queue": context.queue, "retried": context.retried}


class RateServiceDown(Exception):
    pass


@task(max_retries=3, retry_backoff=0, retention=60)
def fetch_rate(name, currency):
    """Celery's autoretry_for=(RateServiceDown,): any other error is not worth a retry."""
    attempts[name] = attempts.get(name, 0) + 1
    try:
        if currency not in ("EUR", "USD"):
            raise ValueError(f"unknown currency {currency}")
        if attempts[name] <= 2:
            raise RateServiceDown("the rate service is down")
    except RateServiceDown:
        raise
    except Exception as exc:
        raise NonRetryableError(str(exc)) from exc
    return attempts[name]


class RetryIn(Exception):
    """Raised by a handler to be retried `seconds` later: Celery's self.retry(countdown=...)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"retry in {seconds}s")
        self.seconds = seconds


def countdown_or_backoff(retried: int, exc: BaseException) -> float:
    from django_rtq.retry import exponential_backoff

    return exc.seconds if isinstance(exc, RetryIn) else exponential_backoff(retried, exc)


@task(max_retries=5, retry_backoff=countdown_or_backoff)
def sync_account(account_id):
    raise RetryIn(600)


@task(timeout=0.5, max_retries=0)
def long_report(name):
    try:
        while not released.wait(0.01):
            pass
    finally:
        ran.append(f"{name}: cleaned up")


@django_task
def django_add(a, b):
    return a + b


@django_task(takes_context=True)
def django_who_am_i(context):
    return {"id": context.task_result.id, "attempt": context.attempt}


def test_shared_task_is_task_and_delay_is_enqueue(run_worker, inspector):
    with pytest.raises(AttributeError):
        add.delay  # noqa: B018 (the guide: there is no delay, use enqueue)
    message = add.enqueue(2, 3)
    with run_worker():
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
    assert done.result == 5
    assert add(2, 3) == 5  # calling the function runs it here, as calling a Celery task does


def test_djangos_own_task_runs_on_the_worker(mirroring, run_worker):
    result = django_add.enqueue(2, 3)
    with run_worker():
        wait_for(lambda: result.refresh() or result.status == TaskResultStatus.SUCCESSFUL)
    assert result.return_value == 5
    assert django_add.get_result(result.id).return_value == 5


def test_apply_async_args_kwargs_and_task_id_are_enqueue_and_using(inspector):
    message = fetch_rate.using(task_id="rate-eur-2026-11-27").enqueue("eur", currency="EUR")
    stored = inspector.get_task("rate-eur-2026-11-27")
    assert message.id == stored.id == "rate-eur-2026-11-27"
    assert (stored.message.args, stored.message.kwargs) == (["eur"], {"currency": "EUR"})


def test_delay_on_commit_is_enqueue_on_commit(inspector):
    with transaction.atomic():
        message = add.enqueue_on_commit(1, 2)
        assert inspector.queue_stats("default").pending == 0
    assert inspector.get_task(message.id).state == TaskState.PENDING


def test_arguments_are_json_not_pickle():
    with pytest.raises(InvalidArguments):
        add.enqueue(datetime.now(UTC), 1)


def test_countdown_is_delay_and_eta_is_process_at(inspector):
    later = add.using(delay=60).enqueue(1, 2)
    eta = datetime.now(UTC) + timedelta(hours=2)
    at_eta = add.using(process_at=eta).enqueue(1, 2)
    scheduled = inspector.get_task(later.id), inspector.get_task(at_eta.id)
    assert [t.state for t in scheduled] == [TaskState.SCHEDULED, TaskState.SCHEDULED]
    assert scheduled[0].score_at == pytest.approx(time.time() + 60, abs=5)
    assert scheduled[1].score_at == pytest.approx(eta.timestamp(), abs=1)


def test_a_short_countdown_runs_once_due(run_worker, inspector):
    message = add.using(delay=0.3).enqueue(1, 2)
    with run_worker():
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
    assert done.result == 3


def test_expires_is_deadline(run_worker, inspector):
    message = record.using(deadline=datetime.now(UTC) - timedelta(seconds=1)).enqueue("expired")
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert archived.info["error_type"] == "django_rtq.exceptions.DeadlineExceeded"
    assert ran == []


def test_priority_higher_runs_first(run_worker, inspector):
    low = record.using(priority=-10).enqueue("low")
    high = record.using(priority=10).enqueue("high")
    with run_worker(concurrency=1):
        wait_for(lambda: len(ran) == 2)
    assert ran == ["high", "low"]
    assert {low.priority, high.priority} == {-10, 10}


def test_queue_per_task_type_and_per_call(run_worker, inspector):
    routed = resize_image.enqueue("cat.png")
    overridden = add.using(queue="low").enqueue(1, 1)
    assert (routed.queue, overridden.queue) == ("low", "low")
    with run_worker(queues={"low": 1}):
        assert wait_state(inspector, routed.id, TaskState.COMPLETED).result == "resized cat.png"
        assert wait_state(inspector, overridden.id, TaskState.COMPLETED).result == 2


def test_bind_and_self_request_are_current_task(run_worker, inspector):
    message = who_am_i.enqueue()
    with run_worker():
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
    assert done.result == {"id": message.id, "task": who_am_i.name, "queue": "default", "retried": 0}
    assert current_task() is None  # outside a worker


def test_djangos_takes_context(mirroring, run_worker):
    result = django_who_am_i.enqueue()
    with run_worker():
        wait_for(lambda: result.refresh() or result.status == TaskResultStatus.SUCCESSFUL)
    assert result.return_value == {"id": result.id, "attempt": 1}


def test_autoretry_for_is_the_default_and_nonretryable_error_opts_out(run_worker, inspector):
    retried = fetch_rate.enqueue("flaky", "EUR")
    refused = fetch_rate.enqueue("unknown", "XYZ")
    with run_worker():
        done = wait_state(inspector, retried.id, TaskState.COMPLETED)
        archived = wait_state(inspector, refused.id, TaskState.ARCHIVED)
    assert (done.result, done.retried) == (3, 2)
    assert (attempts["unknown"], archived.retried) == (1, 0)
    assert archived.info["error_type"] == "django_rtq.exceptions.NonRetryableError"


def test_self_retry_countdown_is_a_backoff_reading_the_error(run_worker, inspector):
    message = sync_account.enqueue(7)
    with run_worker():
        retrying = wait_state(inspector, message.id, TaskState.RETRY)
    assert retrying.retried == 1
    assert retrying.score_at == pytest.approx(time.time() + 600, abs=10)


def test_acks_late_is_a_lease_a_killed_workers_task_runs_again(start_worker, redis_client, inspector):
    name = "celery-guide-lease"
    message = testapp_tasks.block.enqueue(name)
    killed = start_worker("--concurrency", "1", lease=2)
    wait_for(lambda: reports(redis_client, f"{name}:started"), timeout=30)
    killed.kill()
    killed.wait()
    start_worker(lease=2)
    wait_for(lambda: len(reports(redis_client, f"{name}:started")) == 2, timeout=30)
    assert inspector.get_task(message.id).attempt.retried == 0  # the crash is not counted
    redis_client.set(testapp_tasks.report_key(f"release:{name}"), "1")
    wait_state(inspector, message.id, None, timeout=20)  # completed, and deleted (no retention)
    assert reports(redis_client, name) == ["done"]


def test_time_limit_is_timeout_and_the_handler_can_clean_up(run_worker, inspector):
    message = long_report.enqueue("report")
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert archived.info["error_type"] == f"{TaskTimeout.__module__}.{TaskTimeout.__name__}"
    assert ran == ["report: cleaned up"]


def test_beat_schedule_is_periodic(settings, run_worker, inspector):
    settings.RTQ = {
        **settings.RTQ,
        "SCHEDULER_INTERVAL": 0.1,
        "PERIODIC": {"tick": {"task": record.name, "every": 0.2, "args": ["tick"]}},
    }
    with run_worker():
        wait_for(lambda: len(ran) >= 2)
    assert set(ran) == {"tick"}


def test_flower_is_rtq_stats_and_rtq_workers(run_worker):
    add.enqueue(1, 1)
    [stats] = json.loads(run("rtq_stats", "default", "--json"))["queues"]
    assert (stats["queue"], stats["pending"]) == ("default", 1)
    with run_worker() as worker:
        workers = json.loads(run("rtq_workers", "--json"))["workers"]
        assert worker.id in [each["id"] for each in workers]


def test_canvas_is_django_rtq_workflows(run_worker):
    ops = Operations()
    chained = chain(add.s(2, 3), mul.s(10), add.si(1, 1), retention=60).enqueue()
    grouped = group((add.s(i, i) for i in range(3)), retention=60).enqueue()
    chorded = chord([add.s(i, 1) for i in range(5)], total.s(), retention=60).enqueue()
    with run_worker():
        for workflow_id in (chained, grouped, chorded):
            wait_for(lambda workflow_id=workflow_id: ops.live_task(workflow_id).state == TaskState.COMPLETED)
    assert [ops.live_task(w).result for w in (chained, grouped, chorded)] == [2, [0, 2, 4], 15]


def test_async_result_get_is_find_task_or_get_result(mirroring, run_worker, inspector):
    kept = add.enqueue(20, 22)  # retention=60: in Redis after it ran
    forgotten = record.enqueue("no retention")  # deleted from Redis, in the ORM mirror
    with run_worker():
        wait_state(inspector, kept.id, TaskState.COMPLETED)
        wait_for(lambda: Operations().finished_tasks().filter(task_id=forgotten.id).exists())
    ops = Operations()
    assert ops.live_task(kept.id).result == 42
    finished = ops.find_task(forgotten.id)
    assert finished.task_id == forgotten.id


def test_revoke_is_cancel_or_delete(run_worker, inspector):
    ops = Operations()
    waiting = add.using(delay=3600).enqueue(1, 1)
    assert ops.act("delete", [waiting.id]).count == 1
    running = long_report.using(timeout=60).enqueue("cancelled")
    with run_worker() as worker:
        wait_for(worker.subscriber.subscribed.is_set)
        wait_state(inspector, running.id, TaskState.ACTIVE)
        assert ops.act("cancel", [running.id]).count == 1
        archived = wait_state(inspector, running.id, TaskState.ARCHIVED)
    assert archived.info["error_type"] == f"{TaskCancelled.__module__}.{TaskCancelled.__name__}"
    assert inspector.queue_stats("default").scheduled == 0


def test_purge_is_rtq_purge(inspector):
    for i in range(3):
        add.enqueue(i, i)
    report = json.loads(run("rtq_purge", "default", "--no-input", "--json"))
    assert report["total"] == 3
    assert inspector.queue_stats("default").pending == 0


def test_task_always_eager_is_run_eagerly_or_capture_tasks():
    with run_eagerly() as runs:
        add.enqueue(2, 3)
    assert runs.results == [5]
    with capture_tasks() as captured:
        resize_image.enqueue("cat.png")
    captured.assert_enqueued(resize_image, args=["cat.png"], queue="low")


def test_celery_worker_options_are_rtq_workers():
    parser = WorkerCommand().create_parser("manage.py", "rtq_worker")
    options = parser.parse_args(["-c", "8", "-Q", "critical,default", "--processes", "2", "-l", "debug"])
    assert (options.concurrency, options.queues, options.processes, options.loglevel) == (
        8,
        "critical,default",
        2,
        "DEBUG",
    )


#: The recycling options docs/celery.md documents under Celery's names.
WORKER_RECYCLING = ("--max-tasks-per-child", "--max-memory-per-child")


def test_max_tasks_and_memory_per_child_keep_celerys_names():
    """Recycling comes from another branch of issue 27: this passes once it is merged."""
    parser = WorkerCommand().create_parser("manage.py", "rtq_worker")
    missing = [name for name in WORKER_RECYCLING if name not in parser.format_help()]
    assert not missing, f"rtq_worker --help lacks {missing}: docs/celery.md documents them"
    options = parser.parse_args(
        ["--processes", "2", "--max-tasks-per-child", "1000", "--max-memory-per-child", "512"]
    )
    assert (options.max_tasks_per_child, options.max_memory_per_child) == (1000, 512)

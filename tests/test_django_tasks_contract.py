"""`django.tasks` as Django's documentation states it (docs/ref/tasks.txt, docs/topics/tasks.txt,
docs/ref/signals.txt), checked on the backend: each test quotes the sentence it checks. The
tasks run under real workers (in this process, or a real `rtq_worker` process)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from django_rtq.backends import DjangoInvalidTask, TaskResultStatus
from django_rtq.broker import TaskState, manual
from django_rtq.exceptions import NonRetryableError, TaskCancelled
from django_rtq.registry import get_task_type
from django_rtq.testing import run_eagerly
from tests.support.aio import run_async
from tests.support.clock import queue_now
from tests.support.django_tasks import djangos_signals, of, wait_status
from tests.support.factories import WORKER, claim_ids, done
from tests.support.polling import wait_for
from tests.testapp import dtasks
from tests.testapp.tasks import client, report_key

pytestmark = pytest.mark.django_db(transaction=True)

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
BOTH_QUEUES = {"default": 1, "low": 1}


def path(error_class: type) -> str:
    return f"{error_class.__module__}.{error_class.__qualname__}"


def go(name: str) -> None:
    client().rpush(report_key(f"{name}:go"), "1")


def started(name: str) -> bool:
    return bool(client().lrange(report_key(name), 0, -1))


# 1. Enqueueing arguments that are not JSON


def test_an_argument_that_is_not_json_raises_typeerror_as_django_documents(mirroring):
    """docs/topics/tasks.txt, "Enqueueing Tasks": `process_data.enqueue(datetime.now())` raises
    `TypeError: Object of type datetime is not JSON serializable`. So do enqueue and aenqueue here,
    and the error is Django's InvalidTask too."""
    with pytest.raises(TypeError, match="not JSON serializable") as raised:
        dtasks.multiply.enqueue(datetime.now(), 1)
    assert isinstance(raised.value, DjangoInvalidTask)
    with pytest.raises(TypeError, match="not JSON serializable"):
        run_async(dtasks.multiply.aenqueue(1, b=datetime.now()))
    # A call that does not fit the function is refused the same way (Django's own backends
    # leave it to the worker, where calling the function raises TypeError).
    with pytest.raises(TypeError) as raised:
        dtasks.multiply.enqueue(1, 2, 3)
    assert isinstance(raised.value, DjangoInvalidTask)


# 2. and 3. task_finished: the finished result, once, when the task will not run again


def test_task_finished_reports_failed_for_a_return_value_the_worker_cannot_keep(run_worker):
    """docs/ref/signals.txt, task_finished: "task_result: The finished TaskResult". A task whose
    return value is not JSON ends FAILED (the worker cannot store it), and so is the result the
    signal carries, with the error that failed it."""
    with djangos_signals() as sent:
        result = dtasks.returns_what_json_cannot_keep.enqueue()
        with run_worker():
            wait_status(result, FAILED)
            wait_for(lambda: of(sent, result.id, "finished"))
    [finished] = of(sent, result.id, "finished")
    assert finished.status == FAILED
    assert finished.result.errors[-1].exception_class_path == path(NonRetryableError)
    assert result.errors[-1].exception_class_path == path(NonRetryableError)
    assert finished.result.finished_at is not None and finished.result.attempts == 1


def test_task_finished_is_sent_for_an_async_task_cancelled_with_retries_left(run_worker, broker):
    """docs/ref/signals.txt, task_finished: "Sent once a Task has finished executing, whether it
    succeeded or failed". A cancelled task is archived whatever retries it has left: the worker
    decides that once, and the signal follows its decision (an `async def` task is cancelled at
    an await, as asyncio.CancelledError, which the worker turns into TaskCancelled)."""
    with djangos_signals() as sent:
        result = dtasks.async_waits_with_retries_left.enqueue("async-cancelled")
        with run_worker(concurrency=1) as worker:
            wait_for(worker.subscriber.subscribed.is_set)
            wait_for(lambda: started("async-cancelled"))
            assert manual.cancel(broker, "default", result.id, TaskState.ACTIVE) >= 1
            wait_status(result, FAILED)
            wait_for(lambda: of(sent, result.id, "finished"))
    [finished] = of(sent, result.id, "finished")
    assert finished.status == FAILED
    assert finished.result.errors[-1].exception_class_path == path(TaskCancelled)
    assert [s.signal for s in of(sent, result.id)] == ["enqueued", "started", "finished"]


def test_a_retried_task_goes_through_every_status_and_attribute(run_worker, inspector):
    """docs/ref/tasks.txt, TaskResult: `status`, `errors` ("the errors raised as part of each
    execution"), `worker_ids`, `attempts`, `started_at` ("The time when the Task began execution,
    on its first attempt"), `last_attempted_at` ("... the most recent Task run began
    execution"), `finished_at`, `return_value`; docs/ref/signals.txt: task_started before each
    run, task_finished once it has finished (not for the attempt that is retried)."""
    with djangos_signals() as sent:
        before = queue_now()
        result = dtasks.fails_then_waits.enqueue("walk")
        assert (result.status, result.attempts, result.errors, result.worker_ids) == (READY, 0, [], [])
        assert before <= result.enqueued_at <= queue_now()
        assert result.started_at is result.last_attempted_at is result.finished_at is None
        with pytest.raises(ValueError):
            result.return_value  # noqa: B018
        with run_worker():
            wait_for(lambda: started("walk"))
            wait_status(result, RUNNING)
            # The second attempt runs: the first one's error is recorded, its worker counted.
            assert [e.exception_class for e in result.errors] == [RuntimeError]
            assert "first attempt" in result.errors[0].traceback
            assert result.attempts == 2 and len(result.worker_ids) == 2
            assert result.enqueued_at <= result.started_at < result.last_attempted_at
            assert result.finished_at is None and not result.is_finished
            first_started = result.started_at
            go("walk")
            wait_status(result, SUCCESSFUL)
    assert result.return_value == 2 and result.is_finished
    assert result.started_at == first_started
    assert result.started_at < result.last_attempted_at <= result.finished_at
    assert [e.exception_class for e in result.errors] == [RuntimeError] and result.attempts == 2
    signals = [(s.signal, s.status) for s in of(sent, result.id)]
    assert signals == [
        ("enqueued", READY),
        ("started", RUNNING),
        ("started", RUNNING),
        ("finished", SUCCESSFUL),
    ]
    [finished] = of(sent, result.id, "finished")
    assert finished.result.return_value == 2 and finished.result.worker_ids == result.worker_ids
    assert finished.result.started_at == first_started
    [_, second] = of(sent, result.id, "started")
    assert second.result.attempts == 2 and second.result.started_at == first_started


def ran(sent, result_id: str) -> list[tuple[str, str]]:
    """The signals of a result's run (an eager run's come before its `task_enqueued`)."""
    return [(s.signal, s.status) for s in of(sent, result_id) if s.signal != "enqueued"]


def test_an_eager_run_sends_task_finished_as_a_worker_does(prefix):
    """docs/testing.md: under `run_eagerly()` Django's task_started and task_finished are sent;
    task_finished carries the finished result (docs/ref/signals.txt), FAILED for a return value
    a worker could not keep."""
    with djangos_signals() as sent, run_eagerly(propagate=False) as runs:
        ok = dtasks.multiply.enqueue(6, 7)
        bad = dtasks.returns_what_json_cannot_keep.enqueue()
    assert runs.results[0] == 42 and isinstance(runs.errors[-1], NonRetryableError)
    assert ran(sent, ok.id) == [("started", RUNNING), ("finished", SUCCESSFUL)]
    assert of(sent, ok.id, "finished")[0].result.return_value == 42
    assert ran(sent, bad.id) == [("started", RUNNING), ("finished", FAILED)]
    [failed] = of(sent, bad.id, "finished")
    assert failed.result.errors[-1].exception_class_path == path(NonRetryableError)


# 4. and 5. The task as enqueued: stored, read back, run, and in the signals


def test_get_result_returns_the_task_that_was_enqueued_through_using(mirroring):
    """docs/ref/tasks.txt: `TaskResult.task` is "The Task the result was enqueued for", and
    `TaskResult.backend` "The backend the result is from". Read back, the result of a `using()`
    variant equals the one enqueue returned."""
    later = (timezone.now() + timedelta(hours=1)).replace(microsecond=123456)
    variant = dtasks.multiply.using(queue_name="low", priority=7, run_after=later)
    result = variant.enqueue(6, 7)

    found = dtasks.multiply.get_result(result.id)

    assert found == result
    assert found.task == variant and found.task != dtasks.multiply
    assert (found.task.queue_name, found.task.priority, found.task.run_after) == ("low", 7, later)
    assert found.backend == "default" == found.task.backend
    found.refresh()
    assert found.task == variant
    assert run_async(dtasks.multiply.aget_result(result.id)) == result


def test_a_using_variant_leaves_the_process_wide_task_type_alone():
    """docs/ref/tasks.txt, Task.using: "Creates a new Task with modified defaults" — the task it
    is made from keeps its own, and so does the task type django-rtq registered for it."""
    name = dtasks.multiply.module_path
    before = dict(get_task_type(name).options)
    dtasks.multiply.using(queue_name="low", priority=7)
    dtasks.multiply.using(priority=-3)
    assert get_task_type(name).options == before
    assert (before["queue"], before["priority"]) == ("default", 0)


def test_a_running_task_and_its_signals_see_the_variant_it_was_enqueued_as(run_worker):
    """docs/ref/tasks.txt: `TaskContext.task_result` is "The TaskResult currently being run";
    its task is the one enqueued, as is the task of the results task_started and task_finished
    carry — not whichever variant this process made last."""
    later = timezone.now() + timedelta(milliseconds=50)
    enqueued = dtasks.reports_its_task.using(queue_name="low", priority=5, run_after=later)
    with djangos_signals() as sent:
        result = enqueued.enqueue()
        dtasks.reports_its_task.using(priority=9)  # made last, never enqueued
        with run_worker(queues=BOTH_QUEUES):
            wait_status(result, SUCCESSFUL)
            wait_for(lambda: of(sent, result.id, "finished"))
    assert result.return_value == {
        "queue": "low",
        "priority": 5,
        "run_after": later.timestamp(),
        "backend": "default",
        "result_backend": "default",
        "id": result.id,
        "attempt": 1,
    }
    for signal in ("started", "finished"):
        [seen] = of(sent, result.id, signal)
        assert seen.result.task == enqueued, signal
        assert seen.result.backend == "default"


def test_a_worker_process_runs_the_variant_and_another_reads_its_result(start_worker):
    """docs/ref/tasks.txt: `supports_get_result`: "Whether the backend supports retrieving Task
    results from another thread after they have been enqueued"; refresh, arefresh and
    aget_result read what a worker process (which never made the variant) ran."""
    variant = dtasks.reports_its_task.using(queue_name="low", priority=-4)
    result = variant.enqueue()
    worker = start_worker("--queues", "default,low")
    try:
        wait_status(result, SUCCESSFUL, timeout=20)
    finally:
        worker.kill()
        worker.wait()
    assert result.return_value["queue"] == "low" and result.return_value["priority"] == -4
    assert result.task == variant and result.worker_ids[0] == result.worker_ids[-1]
    fetched = run_async(dtasks.reports_its_task.aget_result(result.id))
    assert fetched == result
    other = dtasks.reports_its_task.get_result(result.id)
    run_async(other.arefresh())
    assert (other.status, other.return_value, other.task) == (SUCCESSFUL, result.return_value, variant)


# 6. A running task's times


def test_started_at_and_last_attempted_at_stay_put_while_a_task_runs(mirroring, run_worker, inspector):
    """docs/ref/tasks.txt: `started_at` is "The time when the Task began execution, on its first
    attempt", `last_attempted_at` "The time when the most recent Task run began execution":
    neither moves while the run goes on and the worker renews its lease (every 0.2 s here)."""
    result = dtasks.waits.enqueue("stays")
    with run_worker():
        wait_for(lambda: started("stays"))
        wait_status(result, RUNNING)
        first = (result.started_at, result.last_attempted_at)
        lease = inspector.get_task(result.id).score_at
        for _ in range(3):  # three renewals of the lease, each read after
            wait_for(lambda lease=lease: inspector.get_task(result.id).score_at > lease, message="a renewal")
            lease = inspector.get_task(result.id).score_at
            result.refresh()
            assert result.status == RUNNING
            assert (result.started_at, result.last_attempted_at) == first
        assert first[0] == first[1] and result.enqueued_at <= first[0] <= queue_now()
        go("stays")
        wait_status(result, SUCCESSFUL)
    # Recorded as the attempt ends: its start, a moment after the claim the running one shows.
    assert first[0] <= result.started_at <= first[0] + timedelta(seconds=1)


def test_a_runs_start_is_noted_once_and_read_for_that_run_only(broker, inspector, settings):
    """The start of a run is stored (`rtq:{q}:began`, written once per run by the lease
    renewal): before it is noted, and for a task an older release's worker runs (which notes
    none), it is read from the lease, the same time; an entry of another run is not read."""
    result = dtasks.waits.enqueue("noted")
    assert claim_ids(broker, "default") == [result.id]
    claimed_at = inspector.get_task(result.id).score_at - settings.RTQ["LEASE_SECONDS"]
    found = dtasks.waits.get_result(result.id)
    assert found.status == RUNNING
    assert found.started_at == found.last_attempted_at == _at(claimed_at)
    began = broker.queue("default").began
    for _ in range(2):  # renewals: the first notes the run's start, the next leaves it
        lease = inspector.get_task(result.id).score_at
        # in whole ms of the clock the script reads (the local estimate of it may run ahead)
        lease_start_ms = round((lease - settings.RTQ["LEASE_SECONDS"]) * 1000)
        wait_for(lambda since=lease_start_ms: broker.server_now_ms() > since)
        assert broker.extend_leases("default", [(result.id, True)], worker_id=WORKER) == 1
        assert inspector.get_task(result.id).score_at > lease
        assert broker.client.hget(began, result.id) == f"1:{round(claimed_at * 1000)}"
        assert dtasks.waits.get_result(result.id).started_at == _at(claimed_at)
    broker.client.hset(began, result.id, "7:1000")  # left by another run: not this one's start
    lease_start = inspector.get_task(result.id).score_at - settings.RTQ["LEASE_SECONDS"]
    assert dtasks.waits.get_result(result.id).last_attempted_at == _at(lease_start) != _at(claimed_at)
    assert broker.complete("default", [done(result.id)], worker_id=WORKER) == 1
    assert not broker.client.hexists(began, result.id)


def _at(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC)


# 7. The options of a task on Django 6.0


def test_djangos_6_0_form_gives_a_task_django_rtqs_options(inspector):
    """docs/django.md: Django 6.0's `@task` takes Django's own options only (its other keywords
    arrived in 6.1), so django-rtq's are given to the task it made with `dataclasses.replace`.
    That form works on every version (tests/testapp/dtasks.py declares its other tasks in the
    form the running Django takes)."""
    task = dtasks.settles_on_6_0
    task_type = get_task_type(task.module_path)
    options = task_type.options
    assert (options["max_retries"], options["timeout"]) == (4, 9.5)
    assert (options["queue"], options["priority"]) == ("low", 3)
    result = task.enqueue(1)
    message = inspector.get_task(result.id).message
    assert (message.max_retries, message.timeout, message.queue, message.priority) == (4, 9.5, "low", 3)
    assert dtasks.settles_on_6_0.get_result(result.id).task == task
    assert get_task_type(dtasks.fails_twice.module_path).options["max_retries"] == 2

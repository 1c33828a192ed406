"""The `django.tasks` backend: Django's own `@task` functions enqueued through django-rtq, run by
its worker, their `TaskResult` read from Redis while live and from the ORM mirror after."""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.utils import timezone

from django_rtq import signals as rtq_signals
from django_rtq.backends import (
    DjangoInvalidTask,
    RTQBackend,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)
from django_rtq.broker import TaskState, manual
from django_rtq.exceptions import DeadlineExceeded, NonRetryableError, TaskCancelled
from django_rtq.models import FinishedTask
from tests.support.aio import run_async
from tests.support.clock import queue_now
from tests.support.factories import WORKER, claim_ids, done
from tests.support.polling import wait_for
from tests.support.runs import task_state
from tests.testapp import dtasks
from tests.testapp.tasks import client, report_key

pytestmark = pytest.mark.django_db(transaction=True)


def wait_status(result, status, timeout=10.0):
    def reached():
        result.refresh()
        return result.status == status

    wait_for(reached, timeout, message=f"task {result.id} to be {status}")
    return result


def test_the_backend_supports_everything_django_tasks_asks_about():
    backend = dtasks.multiply.get_backend()
    assert isinstance(backend, RTQBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_async_task and backend.supports_get_result


def test_enqueue_returns_a_ready_result_that_a_worker_completes(mirroring, run_worker, inspector):
    before = queue_now()
    result = dtasks.multiply.enqueue(6, 7)
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert before <= result.enqueued_at <= queue_now()
    assert (result.args, result.kwargs, result.attempts) == ([6, 7], {}, 0)
    assert dtasks.multiply.get_result(result.id).status == TaskResultStatus.READY
    with pytest.raises(ValueError):
        result.return_value  # noqa: B018

    with run_worker():
        wait_status(result, TaskResultStatus.SUCCESSFUL)
        assert result.return_value == 42
        assert result.attempts == 1 and result.worker_ids[0]
        assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at
        assert result.errors == []
        # Deleted from Redis at once (no retention), the result is read from the mirror.
        wait_for(lambda: FinishedTask.objects.filter(pk=result.id).exists())
    assert task_state(inspector, result.id) is None  # gone (another error would raise)
    mirrored = dtasks.multiply.get_result(result.id)
    assert (mirrored.status, mirrored.return_value, mirrored.attempts) == ("SUCCESSFUL", 42, 1)
    assert mirrored.finished_at == result.finished_at
    assert mirrored.worker_ids == result.worker_ids


def test_a_running_task_is_reported_running(mirroring, run_worker):
    result = dtasks.waits.enqueue("waits")
    with run_worker():
        wait_status(result, TaskResultStatus.RUNNING)
        assert result.started_at is not None and result.started_at >= result.enqueued_at
        assert len(result.worker_ids) == 1 and result.finished_at is None
        client().rpush(report_key("waits:go"), "1")
        wait_status(result, TaskResultStatus.SUCCESSFUL)
    assert result.return_value == "done"


def test_a_failed_task_reports_its_error_and_traceback(mirroring, run_worker):
    result = dtasks.fails.enqueue()
    with run_worker():
        wait_status(result, TaskResultStatus.FAILED)
    assert result.attempts == 1  # django.tasks has no retries unless asked for
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "django task failed" in error.traceback and "def fails" not in error.exception_class_path
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018
    wait_for(lambda: FinishedTask.objects.filter(pk=result.id).exists())


@contextmanager
def djangos_finished_results():
    """The results Django's `task_finished` carries, as they are sent."""
    results = []

    def on_finished(sender, task_result, **kwargs):
        results.append((task_result, task_result.status))

    task_finished.connect(on_finished)
    try:
        yield results
    finally:
        task_finished.disconnect(on_finished)


def assert_finished_as_failed(results, task_id, error_class):
    [(result, status)] = [(result, status) for result, status in results if result.id == task_id]
    assert status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == f"{error_class.__module__}.{error_class.__qualname__}"


def test_a_task_refusing_a_retry_is_finished_though_it_has_retries_left(mirroring, run_worker):
    with djangos_finished_results() as finished:
        result = dtasks.refuses_a_retry.enqueue("refuses")
        with run_worker():
            wait_status(result, TaskResultStatus.FAILED)
            wait_for(lambda: finished)
    assert_finished_as_failed(finished, result.id, NonRetryableError)
    assert result.attempts == 1


def test_a_task_past_its_deadline_is_finished_though_it_has_retries_left(mirroring, run_worker):
    task_type = dtasks.waits_with_retries_left.rtq_task_type.using(deadline=time.time() + 0.5)
    with djangos_finished_results() as finished:
        message = task_type.enqueue("late")
        with run_worker():
            result = wait_status(
                dtasks.waits_with_retries_left.get_result(message.id), TaskResultStatus.FAILED
            )
            wait_for(lambda: finished)
    assert_finished_as_failed(finished, message.id, DeadlineExceeded)
    assert result.attempts == 1


def test_a_cancelled_task_is_finished_though_it_has_retries_left(mirroring, run_worker, broker):
    with djangos_finished_results() as finished:
        result = dtasks.waits_with_retries_left.enqueue("cancelled")
        with run_worker(concurrency=1) as worker:
            wait_for(worker.subscriber.subscribed.is_set)
            wait_status(result, TaskResultStatus.RUNNING)
            wait_for(lambda: client().lrange(report_key("cancelled"), 0, -1))
            assert manual.cancel(broker, "default", result.id, TaskState.ACTIVE) >= 1
            wait_status(result, TaskResultStatus.FAILED)
            wait_for(lambda: finished)
    assert_finished_as_failed(finished, result.id, TaskCancelled)
    assert result.attempts == 1


def test_rtq_options_combine_with_djangos_task_decorator(mirroring, run_worker):
    result = dtasks.fails_twice.enqueue("twice")
    with run_worker():
        wait_status(result, TaskResultStatus.SUCCESSFUL, timeout=20)
    assert result.return_value == 3
    assert result.attempts == 3 and len(result.worker_ids) == 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]


def test_a_task_taking_its_context_gets_it(mirroring, run_worker):
    result = dtasks.knows_its_context.enqueue("ctx")
    with run_worker():
        wait_status(result, TaskResultStatus.SUCCESSFUL)
    assert result.return_value == {"label": "ctx", "attempt": 1, "id": result.id}


def test_async_tasks_run(mirroring, run_worker):
    result = dtasks.async_multiply.enqueue(3, 5)
    with run_worker():
        wait_status(result, TaskResultStatus.SUCCESSFUL)
    assert result.return_value == 15


def test_queue_priority_and_run_after_are_honoured(mirroring, inspector):
    later = timezone.now() + timedelta(hours=1)
    result = dtasks.low_priority.using(run_after=later).enqueue("x")
    live = inspector.get_task(result.id)
    assert (live.queue, live.state, live.message.priority) == ("low", TaskState.SCHEDULED, 10)
    assert live.score_at == pytest.approx(later.timestamp(), abs=0.01)
    assert result.status == TaskResultStatus.READY


def test_async_result_api(mirroring, run_worker):
    async def enqueue_and_read():
        result = await dtasks.multiply.aenqueue(2, 2)
        fetched = await dtasks.multiply.aget_result(result.id)
        return result, fetched

    result, fetched = run_async(enqueue_and_read())
    assert fetched.id == result.id and fetched.status == TaskResultStatus.READY
    with run_worker():
        wait_status(result, TaskResultStatus.SUCCESSFUL)
    run_async(fetched.arefresh())
    assert fetched.return_value == 4


def test_djangos_signals_and_rtqs_are_sent(mirroring, run_worker):
    seen = []

    def on(name):
        def receiver(sender, **kwargs):
            result = kwargs.get("task_result")
            seen.append((name, result.status if result else kwargs["message"].task))

        return receiver

    receivers = {
        task_enqueued: on("enqueued"),
        task_started: on("started"),
        task_finished: on("finished"),
        rtq_signals.task_started: on("rtq started"),
        rtq_signals.task_succeeded: on("rtq succeeded"),
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        result = dtasks.multiply.enqueue(1, 2)
        with run_worker():
            wait_status(result, TaskResultStatus.SUCCESSFUL)
            wait_for(lambda: len(seen) == 5)
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    name = "tests.testapp.dtasks.multiply"
    assert seen == [
        ("enqueued", "READY"),
        ("rtq started", name),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
        ("rtq succeeded", name),
    ]


def test_the_running_result_djangos_signals_carry_describes_the_run(mirroring, run_worker):
    results = []

    def on_started(sender, task_result, **kwargs):
        results.append((task_result, task_result.status))

    task_started.connect(on_started)
    try:
        enqueued = dtasks.multiply.enqueue(6, b=7)
        with run_worker():
            wait_status(enqueued, TaskResultStatus.SUCCESSFUL)
    finally:
        task_started.disconnect(on_started)
    [(running, status)] = results
    assert (running.id, status) == (enqueued.id, TaskResultStatus.RUNNING)
    assert (running.args, running.kwargs) == ([6], {"b": 7})
    assert running.enqueued_at == enqueued.enqueued_at
    assert running.started_at is not None and running.started_at == running.last_attempted_at
    assert len(running.worker_ids) == 1
    assert running.errors == []


def test_the_finished_result_is_a_copy_of_the_running_one_with_its_end(mirroring, run_worker):
    """task_finished's result is the running result of the same attempt, copied (not built
    again) with its status, end and return value; the one task_started carried stays RUNNING.
    A later attempt's results carry the earlier attempts' errors and workers."""
    started, finished = [], []

    def on_started(sender, task_result, **kwargs):
        started.append(task_result)

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result)

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        enqueued = dtasks.fails_twice.enqueue("copied")
        with run_worker():
            wait_status(enqueued, TaskResultStatus.SUCCESSFUL, timeout=20)
            wait_for(lambda: finished)
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    mine = [result for result in started if result.id == enqueued.id]
    assert [result.status for result in mine] == [TaskResultStatus.RUNNING] * 3
    assert [len(result.errors) for result in mine] == [0, 1, 2]
    assert [len(result.worker_ids) for result in mine] == [1, 2, 3]
    [done] = [result for result in finished if result.id == enqueued.id]
    last = mine[-1]
    assert done is not last and done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 3 and done.finished_at is not None
    assert (done.args, done.started_at, done.last_attempted_at) == (
        last.args,
        last.started_at,
        last.last_attempted_at,
    )
    assert done.worker_ids == last.worker_ids and done.errors == last.errors
    assert done.started_at == mine[0].started_at  # the first attempt's start


def test_an_unknown_result_id_does_not_exist(mirroring):
    with pytest.raises(TaskResultDoesNotExist):
        dtasks.multiply.get_result("no-such-task")


def test_a_finished_result_is_read_from_the_mirrors_buffer_before_it_reaches_the_orm(mirroring, broker):
    result = dtasks.multiply.enqueue(6, 7)
    assert claim_ids(broker, "default") == [result.id]
    broker.complete("default", [done(result.id, result=42)], worker_id=WORKER)  # no mirrorer runs

    found = dtasks.multiply.get_result(result.id)

    assert (found.status, found.return_value, found.args) == (TaskResultStatus.SUCCESSFUL, 42, [6, 7])
    assert found.finished_at is not None
    assert not FinishedTask.objects.filter(pk=result.id).exists()


def test_a_live_task_whose_message_cannot_be_read_has_no_result(mirroring, broker):
    result = dtasks.multiply.enqueue(6, 7)
    broker.client.hset(broker.queue("default").msg, result.id, "not json")

    with pytest.raises(TaskResultDoesNotExist, match="has a message that cannot be read"):
        dtasks.multiply.get_result(result.id)


def test_bad_arguments_and_queues_are_refused_at_enqueue(mirroring):
    with pytest.raises(DjangoInvalidTask, match="JSON"):
        dtasks.multiply.enqueue(object(), 1)
    with pytest.raises(DjangoInvalidTask, match="Queue 'nowhere'"):
        dtasks.multiply.using(queue_name="nowhere")

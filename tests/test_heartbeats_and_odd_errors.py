"""Leases renewed whatever else of the heartbeat fails, and failures recorded whatever the error
raised is like (issue 25, items 2 and 3); on a real Redis, with real in-process workers."""

from __future__ import annotations

import logging

import pytest

from django_rtq.backends import TaskResultStatus
from django_rtq.broker import Broker, TaskState
from django_rtq.worker.server import Worker
from tests.support.polling import wait_for
from tests.support.runs import reports, wait_state
from tests.testapp import dtasks, tasks

# Leases renewals apart from the heartbeat's other writes

#: A short lease, so that a task outlasts several lease budgets (1.6 s each) in a few seconds.
SHORT_LEASE = 2.0
#: What the UnprintableError's `str()` gives in place of a message.
UNPRINTABLE = "<str() raised AttributeError: 'UnprintableError' object has no attribute 'code'>"


def test_a_registry_write_that_keeps_failing_never_stops_the_lease_renewals(
    broker, inspector, redis_client, prefix, caplog
):
    # A key of the wrong type where the workers set should be: every write of the worker's
    # entry fails (WRONGTYPE), while Redis answers the renewals.
    redis_client.set(broker.keys.workers, "not a sorted set")
    short = Broker(broker.client, prefix=prefix, lease_seconds=SHORT_LEASE)
    message = tasks.block.using(retention=60).enqueue("long", seconds=4 * SHORT_LEASE)
    worker = Worker(broker=short, queues={"default": 1}, concurrency=1, relay=False)
    worker.start()
    try:
        done = wait_state(inspector, message.id, TaskState.COMPLETED, timeout=6 * SHORT_LEASE)
    finally:
        worker.stop()
    assert reports(redis_client, "long:started") == ["1"]  # started once, never stopped
    assert reports(redis_client, "long") == ["gave up"] and done.result == "timeout"
    assert done.attempt.stored.get("recovered", 0) == 0
    told = [
        record
        for record in caplog.records
        if record.name == "django_rtq.worker.heartbeater" and "in the registry" in record.getMessage()
    ]
    # Named, with the key and the reply, once (not once per beat).
    assert len(told) == 1 and told[0].levelno == logging.ERROR
    assert broker.keys.workers in told[0].getMessage() and "WRONGTYPE" in told[0].getMessage()


def test_the_heartbeater_never_waits_past_a_share_of_the_lease_budget(broker, prefix):
    short = Broker(broker.client, prefix=prefix, lease_seconds=SHORT_LEASE)
    worker = Worker(broker=short, queues={"default": 1}, concurrency=1)
    budget = worker.processor.lease_budget
    assert budget == pytest.approx(0.8 * SHORT_LEASE)
    assert worker.heartbeater.interval <= worker.heartbeater.max_backoff <= budget / 3


# Failures recorded whatever the error is like


@pytest.mark.parametrize("kind", sorted(tasks.ODD_ERRORS))
def test_an_odd_error_archives_a_task_without_retries_once(kind, run_worker, inspector, redis_client):
    message = tasks.raises_odd.enqueue("odd", kind)
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    error_class = tasks.ODD_ERRORS[kind]
    assert reports(redis_client, "odd:ran") == ["1"]
    assert archived.attempt.error_type == f"{error_class.__module__}.{error_class.__qualname__}"
    assert archived.attempt.stored.get("recovered", 0) == 0
    if kind == "str":
        assert archived.last_error == UNPRINTABLE
    else:
        assert archived.last_error == "odd"
    assert error_class.__name__ in archived.attempt.traceback
    if kind == "notes":
        assert "<formatting the traceback raised RuntimeError: no notes>" in archived.attempt.traceback
    else:
        assert "raises_odd" in archived.attempt.traceback  # the handler's frame


def test_an_odd_error_is_retried_as_any_failure(run_worker, inspector, redis_client):
    message = tasks.raises_odd.using(max_retries=1).enqueue("odd-retried", "str")
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert reports(redis_client, "odd-retried:ran") == ["1", "1"]
    assert archived.retried == 1 and archived.attempt.stored.get("recovered", 0) == 0
    assert [error["message"] for error in archived.attempt.error_records] == [UNPRINTABLE] * 2


# Not "notes": django-tasks logs the failure with its traceback, which pytest's log capture then
# raises (production's logging prints "--- Logging error ---" and goes on).
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["str", "repr"])
def test_a_django_task_raising_an_odd_error_fails_once(kind, mirroring, run_worker, redis_client):
    result = dtasks.fails_oddly.enqueue(f"django-{kind}", kind)
    with run_worker():

        def failed():
            result.refresh()
            return result.status == TaskResultStatus.FAILED

        wait_for(failed, 10, message="the task to fail")
    assert reports(redis_client, f"django-{kind}:ran") == ["1"]
    [error] = result.errors
    error_class = tasks.ODD_ERRORS[kind]
    assert error.exception_class_path == f"{error_class.__module__}.{error_class.__qualname__}"
    assert error_class.__name__ in error.traceback

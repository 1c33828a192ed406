"""Checkpoints of long tasks: saved fenced by run in the task's info, read back by the next run
(after a retry, a shutdown, a lost lease), deleted with the task; the shutdown stops a handler
at its next checkpoint, uncounted; the QuerySet helper resumes after the last key saved."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from django.contrib.auth.models import User

from django_rtq.broker import Broker, TaskState, manual
from django_rtq.broker.attempt import AttemptInfo
from django_rtq.broker.checkpoint import CHECKPOINT_LIMIT, save_checkpoint
from django_rtq.broker.versions import CHECKPOINT_SINCE
from django_rtq.checkpoints import iterate_batches, iterate_queryset
from django_rtq.context import RunHandle, TaskContext
from django_rtq.exceptions import CheckpointNotSaved, LeaseLost
from tests.support.factories import EMAILS, OTHER_WORKER, WORKER, claim, done, enqueue
from tests.support.polling import wait_for
from tests.support.runs import reports, wait_state
from tests.testapp.tasks import backfills_users, counts_with_checkpoints, saves_one_checkpoint


def stored_info(broker: Broker, task_id: str) -> dict | None:
    raw = broker.client.hget(broker.queue(EMAILS).info, task_id)
    return json.loads(raw) if raw else None


def save(broker: Broker, claimed, value, worker: str = WORKER) -> float | None:
    return save_checkpoint(
        broker, EMAILS, claimed.id, worker_id=worker, run=claimed.run, value_json=json.dumps(value)
    )


# The script, on one Redis and on the cluster


def test_a_checkpoint_is_saved_in_the_info_and_read_at_the_next_claim(any_broker: Broker):
    (task_id,) = enqueue(any_broker)
    (first,) = claim(any_broker)
    saved_at = save(any_broker, first, {"after": 41})
    assert saved_at == pytest.approx(any_broker.clock(), abs=1)
    info = stored_info(any_broker, task_id)
    assert info == {"v": CHECKPOINT_SINCE, "checkpoint": '{"after": 41}', "checkpointed_at": saved_at}
    assert any_broker.requeue(EMAILS, [task_id], worker_id=WORKER) == 1  # a shutdown: uncounted
    (second,) = claim(any_broker)
    facts = AttemptInfo.from_mapping(second.info)
    assert (facts.checkpoint_json, facts.checkpointed_at, facts.retried) == ('{"after": 41}', saved_at, 0)


def test_a_stale_run_cannot_overwrite_the_checkpoint_of_a_newer_run(any_broker: Broker, clock):
    (task_id,) = enqueue(any_broker)
    (stale,) = claim(any_broker, lease=5)
    assert save(any_broker, stale, 10) is not None
    clock.advance(10)  # its lease ran out: the recoverer gives the task to another worker
    assert any_broker.recover(EMAILS, grace_ms=0, max_recoveries=3) == [(task_id, "recovered")]
    (newer,) = claim(any_broker, worker=OTHER_WORKER)
    assert save(any_broker, newer, 20, worker=OTHER_WORKER) is not None
    assert save(any_broker, stale, 15) is None  # the stale run is told, and changes nothing
    info = stored_info(any_broker, task_id)
    assert (info["checkpoint"], info["recovered"]) == ("20", 1)
    assert save(any_broker, newer, 30, worker=WORKER) is None  # nor may another worker write for it


def test_the_checkpoint_goes_with_the_task(any_broker: Broker):
    completed, deleted = enqueue(any_broker, count=2)
    for claimed in claim(any_broker):
        save(any_broker, claimed, "cursor")
    assert any_broker.complete(EMAILS, [done(completed)], worker_id=WORKER) == 1
    assert stored_info(any_broker, completed) is None
    assert any_broker.requeue(EMAILS, [deleted], worker_id=WORKER) == 1
    assert manual.delete(any_broker, EMAILS, [deleted]) == 1
    assert stored_info(any_broker, deleted) is None


def test_a_finished_or_waiting_task_takes_no_checkpoint(any_broker: Broker):
    (task_id,) = enqueue(any_broker)
    (claimed,) = claim(any_broker)
    assert any_broker.requeue(EMAILS, [task_id], worker_id=WORKER) == 1
    assert save(any_broker, claimed, 1) is None  # pending now: no run holds it
    assert stored_info(any_broker, task_id) is None


# The handler's side: TaskContext.save_checkpoint


def context_of(claimed, worker: str = WORKER) -> TaskContext:
    return TaskContext(
        id=claimed.id,
        task="tests.noop",
        queue=claimed.queue,
        retried=0,
        max_retries=0,
        info=claimed.info,
        handle=RunHandle(claimed=claimed, worker_id=worker),
    )


def test_a_handler_reads_back_what_it_saved_and_its_settling_keeps_it(broker: Broker):
    enqueue(broker)
    (claimed,) = claim(broker)
    context = context_of(claimed)
    assert (context.checkpoint, context.checkpointed_at) == (None, None)
    assert context.save_checkpoint([1, "two", {"three": 3.5}]) is True
    assert context.checkpoint == [1, "two", {"three": 3.5}]
    assert context.checkpointed_at == pytest.approx(time.time(), abs=5)
    assert claimed.checkpoint["checkpoint"] == '[1,"two",{"three":3.5}]'
    assert claimed.info == {}  # the facts of the claim stay as they were read


def test_a_value_that_cannot_be_saved_is_refused_before_redis_is_asked(broker: Broker):
    context = TaskContext(id="t", task="tests.noop", queue=EMAILS, retried=0, max_retries=0)
    with pytest.raises(CheckpointNotSaved, match="JSON-serialisable"):
        context.save_checkpoint({"at": object()})
    with pytest.raises(CheckpointNotSaved, match="JSON-serialisable"):
        context.save_checkpoint(float("nan"))
    with pytest.raises(CheckpointNotSaved, match="at most"):
        context.save_checkpoint("x" * CHECKPOINT_LIMIT)
    assert context.save_checkpoint(7) is True  # outside a worker: kept in memory
    assert context.checkpoint == 7


def test_a_stale_run_is_told_by_lease_lost(broker: Broker, clock):
    broker.clock = clock
    (task_id,) = enqueue(broker)
    (stale,) = claim(broker, lease=5)
    clock.advance(10)
    broker.recover(EMAILS, grace_ms=0, max_recoveries=3)
    claim(broker, worker=OTHER_WORKER)
    with pytest.raises(LeaseLost):
        context_of(stale).save_checkpoint(99)
    assert stored_info(broker, task_id) == {"recovered": 1}


def test_redis_away_keeps_the_last_checkpoint_and_the_handler_goes_on(broker: Broker, redis_away):
    # `broker` is on the real Redis; the process's own (the handler's) points where none listens.
    enqueue(broker)
    (claimed,) = claim(broker)
    context = context_of(claimed)
    assert context.save_checkpoint(1) is False  # logged; the handler goes on
    assert (context.checkpoint, stored_info(broker, claimed.id)) == (None, None)
    redis_away()  # Redis is back
    assert context.save_checkpoint(2) is True
    assert (context.checkpoint, stored_info(broker, claimed.id)["checkpoint"]) == (2, "2")


# Real workers


def test_a_retry_resumes_from_the_checkpoint_saved_before_the_failure(run_worker, redis_client, inspector):
    result = counts_with_checkpoints.enqueue("retried", 10, fail_at=4)
    with run_worker():
        task = wait_state(inspector, result.id, TaskState.COMPLETED)
    assert reports(redis_client, "retried") == [str(n) for n in range(1, 11)]  # none twice
    runs = [json.loads(line) for line in reports(redis_client, "retried:runs")]
    assert runs == [{"checkpoint": None, "retried": 0}, {"checkpoint": 4, "retried": 1}]
    assert "checkpoint" not in task.info  # done: nothing resumes from it


def test_a_shutdown_stops_the_handler_at_its_next_checkpoint_uncounted(run_worker, redis_client, inspector):
    result = counts_with_checkpoints.enqueue("stopped", 100_000, pause=0.01)
    with run_worker(shutdown_timeout=60) as worker:
        wait_for(lambda: len(reports(redis_client, "stopped")) >= 20, message="the task to count")
        began = time.monotonic()
        worker.stop()
        took = time.monotonic() - began
    assert took < 10, f"the worker waited {took:.1f}s: it did not stop the handler at its checkpoint"
    task = wait_state(inspector, result.id, TaskState.PENDING)
    counted = [int(n) for n in reports(redis_client, "stopped")]
    facts = AttemptInfo.from_mapping(task.info)
    assert json.loads(facts.checkpoint_json) == counted[-1]  # saved, then stopped at once
    assert (facts.retried, facts.error_records, facts.get("recovered")) == (0, [], None)
    with run_worker():
        wait_for(lambda: len(reports(redis_client, "stopped:runs")) == 2, message="the next run")
    runs = [json.loads(line) for line in reports(redis_client, "stopped:runs")]
    assert runs[1] == {"checkpoint": counted[-1], "retried": 0}
    counted = [int(n) for n in reports(redis_client, "stopped")]
    assert len(counted) == len(set(counted))  # nothing counted twice


def test_a_handler_past_the_shutdown_timeout_is_stopped_uncounted_and_keeps_its_checkpoint(
    run_worker, redis_client, inspector
):
    result = saves_one_checkpoint.enqueue("timed-out", 60)
    with run_worker(shutdown_timeout=0.5) as worker:
        wait_for(lambda: reports(redis_client, "timed-out"), message="the task to start")
        wait_for(lambda: inspector.get_task(result.id).info.get("checkpoint"), message="its checkpoint")
        worker.stop()  # no checkpoint comes: the timeout stops it with WorkerShutdown
    task = wait_state(inspector, result.id, TaskState.PENDING)
    facts = AttemptInfo.from_mapping(task.info)
    assert (facts.checkpoint_json, facts.retried, facts.error_records) == ('"first"', 0, [])
    with run_worker(shutdown_timeout=0.5):
        wait_for(lambda: len(reports(redis_client, "timed-out")) == 2, message="the next run")
    assert json.loads(reports(redis_client, "timed-out")[1]) == {"checkpoint": "first", "retried": 0}


# The QuerySet helper, on the test database (SQLite, or PostgreSQL with RTQ_TEST_DATABASE)


@pytest.mark.django_db(transaction=True)
def test_a_backfill_resumes_after_the_last_batch_it_saved(
    run_worker, redis_client, inspector, django_user_model
):
    users = [django_user_model.objects.create(username=f"user-{n}") for n in range(25)]
    pks = sorted(user.pk for user in users)
    result = backfills_users.enqueue("backfill", 10, fail_in_batch=2)
    with run_worker():
        wait_state(inspector, result.id, TaskState.COMPLETED)
    seen = [int(pk) for pk in reports(redis_client, "backfill")]
    assert seen == pks[:20] + pks[10:]  # the failed batch again, then on
    runs = [json.loads(line) for line in reports(redis_client, "backfill:runs")]
    assert runs == [{"checkpoint": None, "retried": 0}, {"checkpoint": pks[9], "retried": 1}]


@pytest.mark.django_db
def test_the_queryset_helpers_walk_by_key_outside_a_worker_too(django_user_model):
    for n in (3, 1, 2):
        django_user_model.objects.create(username=f"user-{n}")
    by_name = django_user_model.objects.order_by("-username")
    assert [user.username for user in iterate_queryset(by_name, batch_size=2)] == [
        "user-3",
        "user-1",
        "user-2",
    ]
    sizes = [len(batch) for batch in iterate_batches(by_name, batch_size=2)]
    assert sizes == [2, 1]
    with pytest.raises(ValueError):
        next(iterate_batches(by_name, batch_size=0))


# Shown: the admin's task page and the API


@pytest.mark.django_db
def test_the_admin_and_the_api_show_the_checkpoint_of_a_task_that_will_resume(
    broker: Broker, superuser_client
):
    from rest_framework.test import APIClient

    from tests.support.admin_pages import task_url

    waiting, fresh = enqueue(broker, count=2)
    claimed = {task.id: task for task in claim(broker)}
    saved_at = save(broker, claimed[waiting], {"after_pk": 1500})
    assert broker.requeue(EMAILS, [waiting, fresh], worker_id=WORKER) == 2

    page = superuser_client.get(task_url(waiting, EMAILS))
    assert page.status_code == 200
    assert page.context["checkpoint"] == '{"after_pk": 1500}'
    assert 'id="rtq-checkpoint"' in page.text and "{&quot;after_pk&quot;: 1500}" in page.text
    assert "Checkpointed at" not in page.text  # shown apart, not among the attempt facts
    assert 'id="rtq-checkpoint"' not in superuser_client.get(task_url(fresh, EMAILS)).text

    api = APIClient()
    api.force_authenticate(User.objects.get(username="admin"))
    body = api.get(f"/rtq/api/tasks/{waiting}/?queue={EMAILS}").json()
    assert body["checkpoint"] == {"after_pk": 1500}
    assert datetime.fromisoformat(body["checkpointed_at"]).timestamp() == pytest.approx(saved_at, abs=0.001)
    body = api.get(f"/rtq/api/tasks/{fresh}/?queue={EMAILS}").json()
    assert (body["checkpoint"], body["checkpointed_at"]) == (None, None)


def test_on_the_cluster_a_worker_resumes_from_the_checkpoint_and_stops_at_one(
    cluster_broker, redis_client, prefix
):
    from django_rtq.broker.inspect import Inspector
    from django_rtq.worker.server import Worker

    inspector = Inspector(cluster_broker)
    queues = {"emails": 1, "billing": 1}  # on two nodes of the cluster
    retried = counts_with_checkpoints.using(queue="billing").prepare("cluster-retried", 6, fail_at=3)
    stopped = counts_with_checkpoints.using(queue="emails").prepare("cluster-stopped", 100_000, pause=0.01)
    cluster_broker.enqueue([retried, stopped])
    worker = Worker(broker=cluster_broker, queues=queues, concurrency=2, shutdown_timeout=60, relay=False)
    worker.start()
    try:
        wait_for(lambda: inspector.get_task(retried.id).state == TaskState.COMPLETED, message="the retry")
        wait_for(
            lambda: len(reports(redis_client, "cluster-stopped")) >= 10, message="the long task to count"
        )
    finally:
        began = time.monotonic()
        worker.stop()
        took = time.monotonic() - began
    assert reports(redis_client, "cluster-retried") == [str(n) for n in range(1, 7)]
    assert took < 10, f"the worker waited {took:.1f}s instead of stopping the task at a checkpoint"
    task = inspector.get_task(stopped.id)
    facts = AttemptInfo.from_mapping(task.info)
    assert task.state == TaskState.PENDING
    assert (json.loads(facts.checkpoint_json), facts.retried) == (
        int(reports(redis_client, "cluster-stopped")[-1]),
        0,
    )

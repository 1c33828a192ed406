"""Snooze: a handler raises Snooze(seconds) to run again later with no attempt counted, and may
hold its whole type meanwhile (docs/snooze.md). On the standalone Redis and the 3-master Cluster."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from django_rtq import Snooze, signals
from django_rtq.backends import TaskResultStatus
from django_rtq.broker import Broker, TaskMessage, TaskState
from django_rtq.broker.attempt import AttemptInfo
from django_rtq.broker.inspect import Inspector
from django_rtq.broker.limits import HELD_BASE, FlowLimits, Limit, PartitionLimits, partition_scope
from django_rtq.broker.snoozing import held_types
from django_rtq.exceptions import MAX_SNOOZE_SECONDS
from django_rtq.operations import Operations
from django_rtq.worker.outcome import Failure
from django_rtq.worker.server import Worker
from django_rtq.worker.snoozing import settle_snooze
from tests.support.clock import START_TIME
from tests.support.factories import EMAILS, WORKER, enqueue
from tests.support.polling import wait_for
from tests.support.runs import reports, wait_state
from tests.testapp import dtasks, tasks

PAY, MAIL = "shop.tasks.pay", "shop.tasks.mail"


def no_limits(broker: Broker) -> None:
    flow = FlowLimits(types={}, queues={})
    broker.limits = lambda: flow


def add(broker: Broker, task: str, count: int = 1, **fields) -> list[str]:
    return enqueue(broker, EMAILS, count, task=task, **fields)


def claim(broker: Broker, limit: int = 10):
    return broker.claim(EMAILS, worker_id=WORKER, limit=limit)


def ids(claimed) -> list[str]:
    return [task.id for task in claimed]


def snoozed(
    broker: Broker,
    claimed,
    seconds: float,
    *,
    hold_type: bool = False,
    hold_partition: bool = False,
    max_snoozes: int = 100,
):
    """Settle a claimed task as the settler does when its handler raised Snooze."""
    raw = claimed.raw_message
    message = TaskMessage.from_json(raw, id=claimed.id, queue=EMAILS)
    request = Snooze(seconds, hold_type=hold_type, hold_partition=hold_partition)
    failure = Failure(claimed=claimed, message=message, error=request, started_at=START_TIME)
    return settle_snooze(broker, failure, worker_id=WORKER, max_snoozes=max_snoozes)


def stored_info(broker: Broker, task_id: str) -> dict:
    return json.loads(broker.client.hget(broker.queue(EMAILS).info, task_id) or "{}")


# The exception


@pytest.mark.parametrize(
    "seconds", [-1, float("nan"), float("inf"), MAX_SNOOZE_SECONDS + 1, "30", True, None]
)
def test_snooze_refuses_what_is_not_a_number_of_seconds(seconds):
    with pytest.raises(ValueError, match="Snooze"):
        Snooze(seconds)


def test_snooze_keeps_its_seconds_and_whether_it_holds_its_type():
    request = Snooze(30, hold_type=True)
    assert (request.seconds, request.hold_type) == (30.0, True)
    assert "30s" in str(request) and Snooze(0).hold_type is False


def test_a_snooze_holding_its_type_holds_its_partitions_with_it():
    assert Snooze(30, hold_partition=True).hold_partition is True
    request = Snooze(30, hold_type=True, hold_partition=True)
    assert (request.hold_type, request.hold_partition) == (True, False)
    assert "(its partition held)" in str(Snooze(5, hold_partition=True))


# The broker (the snooze script, the claim's holds), on a clock the test moves


def test_a_snoozed_task_is_scheduled_then_with_no_attempt_counted(any_broker, clock):
    no_limits(any_broker)
    (task_id,) = add(any_broker, PAY, max_retries=3)
    (claimed,) = claim(any_broker)
    assert snoozed(any_broker, claimed, 30) == TaskState.SCHEDULED

    queue = any_broker.queue(EMAILS)
    assert any_broker.client.hget(queue.state, task_id) == TaskState.SCHEDULED
    assert any_broker.client.zscore(queue.scheduled, task_id) == clock.ms(30)
    assert not any_broker.client.zscore(queue.active, task_id)
    info = stored_info(any_broker, task_id)
    assert info == {"v": 2, "snoozed": 1, "snoozed_at": START_TIME}
    day = "2023-11-14"
    assert any_broker.client.get(queue.snoozed(day)) == "1"
    assert any_broker.client.get(queue.processed(day)) is None  # not an attempt

    clock.advance(29)
    assert any_broker.forward(EMAILS) == 0
    clock.advance(1)
    assert any_broker.forward(EMAILS) == 1
    (again,) = claim(any_broker)
    facts = AttemptInfo.from_mapping(again.info)
    assert (again.id, facts.retried, facts.snoozed, facts.workers) == (task_id, 0, 1, [])


def test_snoozes_add_up_and_failures_keep_them(any_broker, clock):
    no_limits(any_broker)
    (task_id,) = add(any_broker, PAY, max_retries=3)
    for _ in range(2):
        (claimed,) = claim(any_broker)
        snoozed(any_broker, claimed, 0)
        any_broker.forward(EMAILS)
    assert stored_info(any_broker, task_id)["snoozed"] == 2
    (claimed,) = claim(any_broker)
    facts = AttemptInfo.from_mapping(claimed.info)
    info = facts.failed(RuntimeError("x"), "", worker_id=WORKER, started_at=1.0, failed_at=2.0, retrying=True)
    any_broker.fail(EMAILS, task_id, worker_id=WORKER, run=claimed.run, to=TaskState.RETRY, info=info)
    stored = stored_info(any_broker, task_id)
    assert (stored["v"], stored["snoozed"], stored["retried"]) == (2, 2, 1)


def test_a_snooze_that_comes_late_is_left_out(any_broker, clock):
    no_limits(any_broker)
    (task_id,) = add(any_broker, PAY)
    (claimed,) = claim(any_broker)
    stale = dataclasses.replace(claimed, run="7")  # not its current run: a newer one started
    assert snoozed(any_broker, stale, 30) is None
    assert any_broker.client.hget(any_broker.queue(EMAILS).state, task_id) == TaskState.ACTIVE
    assert stored_info(any_broker, task_id) == {}


def test_a_task_snoozed_max_snoozes_times_is_archived_with_the_reason(any_broker, clock):
    no_limits(any_broker)
    (task_id,) = add(any_broker, PAY, max_retries=3)
    for _ in range(2):
        (claimed,) = claim(any_broker)
        assert snoozed(any_broker, claimed, 0, max_snoozes=2) == TaskState.SCHEDULED
        any_broker.forward(EMAILS)
    (claimed,) = claim(any_broker)
    assert snoozed(any_broker, claimed, 0, max_snoozes=2) == TaskState.ARCHIVED
    info = stored_info(any_broker, task_id)
    assert info["error_type"] == "django_rtq.exceptions.TooManySnoozes"
    assert "snoozed 2 times" in info["error"] and info["snoozed"] == 2


def test_a_hold_keeps_the_types_other_tasks_back_until_it_ends(any_broker, clock):
    no_limits(any_broker)
    pay = add(any_broker, PAY, 3)
    mail = add(any_broker, MAIL, 2)
    (first,) = claim(any_broker, limit=1)
    assert first.id == pay[0]
    snoozed(any_broker, first, 30, hold_type=True)
    assert held_types(any_broker, EMAILS) == {PAY: clock.ms(30)}

    claimed = claim(any_broker)
    assert ids(claimed) == mail  # other types are not held up
    held = Inspector(any_broker).get_task(pay[1], EMAILS)
    assert held.held and Operations(broker=any_broker).held_reason(held) == (
        f"Held back for 30s more: a task of its type {PAY} snoozed holding its type "
        "(Snooze(hold_type=True)), and none of the type starts in the queue before then."
    )
    assert claimed.wait == pytest.approx(30, abs=0.002)  # the worker claims again when it ends
    queue = any_broker.queue(EMAILS)
    assert all(any_broker.client.zscore(queue.pending, i) >= HELD_BASE for i in pay[1:])
    (late,) = add(any_broker, PAY)  # a task of the type enqueued meanwhile waits too
    clock.advance(29.9)
    assert ids(claim(any_broker)) == []

    clock.advance(0.1)
    any_broker.forward(EMAILS)
    assert sorted(ids(claim(any_broker))) == sorted([*pay, late])
    assert held_types(any_broker, EMAILS) == {}  # the claim dropped the hold that ended
    assert not any_broker.client.exists(queue.held)


def test_a_hold_and_a_rate_limit_together(any_broker, clock):
    flow = FlowLimits(types={PAY: Limit(rate=1, period=1.0)}, queues={})
    any_broker.limits = lambda: flow
    pay = add(any_broker, PAY, 3)
    (first,) = claim(any_broker)
    snoozed(any_broker, first, 5, hold_type=True)
    clock.advance(2)  # the rate allows a start, the hold does not
    assert ids(claim(any_broker)) == []
    clock.advance(3)
    assert ids(claim(any_broker)) == [pay[1]]  # then the rate applies again
    clock.advance(1)
    assert ids(claim(any_broker)) == [pay[2]]


def test_a_shorter_hold_leaves_a_longer_one_in_place(any_broker, clock):
    no_limits(any_broker)
    add(any_broker, PAY, 2)
    first, second = claim(any_broker)
    snoozed(any_broker, first, 60, hold_type=True)
    snoozed(any_broker, second, 10, hold_type=True)
    assert held_types(any_broker, EMAILS) == {PAY: clock.ms(60)}


def test_a_snooze_without_hold_holds_nothing_and_the_claim_stays_plain(any_broker, clock):
    no_limits(any_broker)
    add(any_broker, PAY, 2)
    (first,) = claim(any_broker, limit=1)
    snoozed(any_broker, first, 30)
    claimed = claim(any_broker)
    assert len(claimed) == 1 and claimed.wait is None
    queue = any_broker.queue(EMAILS)
    assert not any_broker.client.exists(queue.holds, queue.held)


@pytest.mark.parametrize("each", [None, Limit(max_concurrency=5)], ids=["no-limits", "partition-limits"])
def test_a_partition_hold_keeps_that_partition_back_and_the_others_run(any_broker, clock, each):
    flow = FlowLimits(types={}, queues={}, partitions={PAY: PartitionLimits(each=each)} if each else {})
    any_broker.limits = lambda: flow
    add(any_broker, PAY, partition="acme")
    (first,) = claim(any_broker, limit=1)
    sent = []

    def receiver(sender, **kwargs):
        sent.append(kwargs)

    signals.task_snoozed.connect(receiver)
    try:
        snoozed(any_broker, first, 30, hold_partition=True)
    finally:
        signals.task_snoozed.disconnect(receiver)
    assert [(s["hold_type"], s["hold_partition"]) for s in sent] == [(False, True)]
    assert held_types(any_broker, EMAILS) == {partition_scope(PAY, "acme"): clock.ms(30)}
    acme = add(any_broker, PAY, 2, partition="acme")
    beta = add(any_broker, PAY, 2, partition="beta")
    plain = add(any_broker, PAY)

    claimed = claim(any_broker)
    assert sorted(ids(claimed)) == sorted([*beta, *plain])  # the type's other partitions run
    assert claimed.wait == pytest.approx(30, abs=0.002)  # the worker claims again when it ends
    held = Inspector(any_broker).get_task(acme[0], EMAILS)
    assert held.held and Operations(broker=any_broker).held_reason(held) == (
        f"Held back for 30s more: a task of its partition acme of {PAY} snoozed holding its "
        "partition (Snooze(hold_partition=True)), and none of the partition starts in the queue "
        "before then."
    )
    clock.advance(29.9)
    assert ids(claim(any_broker)) == []

    clock.advance(0.1)
    any_broker.forward(EMAILS)
    assert sorted(ids(claim(any_broker))) == sorted([*acme, first.id])
    assert held_types(any_broker, EMAILS) == {}


def test_a_partition_hold_shows_in_the_flow_control_use(any_broker, clock):
    no_limits(any_broker)
    add(any_broker, PAY, partition="acme")
    (first,) = claim(any_broker, limit=1)
    snoozed(any_broker, first, 30, hold_partition=True)
    add(any_broker, PAY, 2, partition="acme")
    claim(any_broker)
    (use,) = Inspector(any_broker).limit_use(EMAILS, {})
    assert (use.task, use.partition, use.held, use.running) == (PAY, "acme", 2, 0)
    assert use.label == f"{PAY} · partition acme"


def test_a_task_without_a_partition_holding_its_partition_holds_nothing_else(any_broker, clock, caplog):
    no_limits(any_broker)
    add(any_broker, PAY, 3)
    (first,) = claim(any_broker, limit=1)
    with caplog.at_level(logging.WARNING, "django_rtq.worker.snoozing"):
        assert snoozed(any_broker, first, 30, hold_partition=True) == TaskState.SCHEDULED
    assert "has no partition" in caplog.text and first.id in caplog.text
    assert held_types(any_broker, EMAILS) == {}
    assert len(claim(any_broker)) == 2  # the type's other tasks run
    assert any_broker.client.zscore(any_broker.queue(EMAILS).scheduled, first.id) == clock.ms(30)


def test_a_held_type_is_never_handed_to_an_idle_worker(broker):
    no_limits(broker)
    add(broker, PAY)
    (first,) = claim(broker)
    snoozed(broker, first, 30, hold_type=True)
    broker.claim(EMAILS, worker_id=WORKER, limit=10, idle_for_ms=60_000)  # now registered as idle
    pubsub = broker.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(broker.queue(EMAILS).handoff_prefix + WORKER)
    try:
        (task,) = add(broker, PAY)
        assert broker.client.hget(broker.queue(EMAILS).state, task) == TaskState.PENDING
        assert broker.client.zscore(broker.queue(EMAILS).idle, WORKER)  # still idle: not handed to it
    finally:
        pubsub.close()


# Real workers, on the standalone Redis


@pytest.mark.parametrize("handler", [tasks.snoozes_once, tasks.snoozes_once_async])
def test_a_worker_runs_a_snoozed_task_again_without_charging_an_attempt(
    handler, run_worker, inspector, redis_client, caplog
):
    caplog.set_level(logging.INFO, "django_rtq.tasks")
    received = []

    def receiver(sender, **kwargs):
        received.append(kwargs)

    signals.task_snoozed.connect(receiver)
    try:
        message = handler.prepare("nap", 0.3)
        inspector.broker.enqueue([message])
        with run_worker(concurrency=2):
            wait_for(lambda: reports(redis_client, "nap"), timeout=10)
            done = wait_state(inspector, message.id, TaskState.COMPLETED)
    finally:
        signals.task_snoozed.disconnect(receiver)
    assert reports(redis_client, "nap") == ["0"]  # no retry counted
    assert redis_client.get(tasks.report_key("nap:runs")) == "2"
    assert (done.attempt.retried, done.attempt.snoozed, len(done.attempt.workers)) == (0, 1, 1)
    (sent,) = received
    assert sent["seconds"] == 0.3 and sent["snoozed"] == 1 and not sent["hold_type"]
    (line,) = [r for r in caplog.records if r.name == "django_rtq.tasks" and r.outcome == "snoozed"]
    assert "snoozed for 0.3s (snooze 1 of at most 100, no attempt counted)" in line.getMessage()
    stats = inspector.queue_stats("default")
    assert stats.processed_today == 1 and stats.failed_today == 0


def test_a_handler_that_always_snoozes_is_archived_after_max_snoozes(
    settings, run_worker, inspector, redis_client
):
    settings.RTQ = {**settings.RTQ, "MAX_SNOOZES": 2}
    message = tasks.always_snoozes.prepare("insomniac")
    inspector.broker.enqueue([message])
    with run_worker():
        archived = wait_state(inspector, message.id, TaskState.ARCHIVED)
    assert archived.attempt.error_type == "django_rtq.exceptions.TooManySnoozes"
    assert redis_client.get(tasks.report_key("insomniac:runs")) == "3"
    assert archived.attempt.retried == 0  # archived at once: a snooze is no failure to retry


def test_a_hold_makes_the_types_other_tasks_wait_and_others_run(run_worker, inspector, redis_client):
    broker = inspector.broker
    first = tasks.calls_api.prepare("api", 1.0)
    broker.enqueue([first])
    with run_worker(concurrency=4):
        wait_state(inspector, first.id, TaskState.SCHEDULED)
        (until_ms,) = held_types(broker, "default").values()
        later = [tasks.calls_api.prepare("api") for _ in range(3)]
        broker.enqueue([*later, tasks.record.prepare("other", "ran")])  # the worker is idle now
        wait_for(lambda: reports(redis_client, "other") == ["ran"], timeout=5)
        wait_for(lambda: len(reports(redis_client, "api")) == 4, timeout=10)
    started = [float(at) for at in reports(redis_client, "api")]
    assert min(started) >= until_ms / 1000 - 0.01  # none of the type started before the hold ended
    assert redis_client.get(tasks.report_key("api:runs")) == "2"


@pytest.mark.django_db(transaction=True)
def test_a_django_task_reads_ready_while_snoozed_then_succeeds_with_one_attempt(
    mirroring, run_worker, inspector
):
    result = dtasks.snoozes_once_django.enqueue("dj-nap", 1.0)
    with run_worker():
        wait_state(inspector, result.id, TaskState.SCHEDULED)
        result.refresh()
        assert result.status == TaskResultStatus.READY and result.attempts == 0 and result.errors == []
        wait_for(lambda: (result.refresh(), result.status)[1] == TaskResultStatus.SUCCESSFUL, timeout=10)
    assert result.return_value == "dj-nap"
    assert result.attempts == 1 and result.errors == []


@pytest.mark.django_db
def test_the_api_and_the_admin_page_show_the_snoozes(run_worker, inspector, superuser_client):
    message = tasks.snoozes_once.prepare("shown", 30)
    inspector.broker.enqueue([message])
    with run_worker():
        wait_state(inspector, message.id, TaskState.SCHEDULED)
    api = APIClient()
    api.force_authenticate(User.objects.get(username="admin"))
    body = api.get(f"/rtq/api/tasks/{message.id}/").json()
    assert (body["state"], body["snoozed"], body["retried"]) == ("scheduled", 1, 0)
    page = superuser_client.get(reverse("admin:django_rtq_task", args=[message.id])).content.decode()
    assert 'id="rtq-snoozed"' in page and "1 time, no attempt counted" in page
    queue = api.get("/rtq/api/queues/default/").json()
    assert (queue["scheduled"], queue["snoozed_today"]) == (1, 1)
    scraped = superuser_client.get("/rtq/metrics/").content.decode()
    (family,) = [f for f in text_string_to_metric_families(scraped) if f.name == "rtq_tasks_snoozed"]
    assert {s.labels["queue"]: s.value for s in family.samples if s.name.endswith("_total")}["default"] == 1


# Real workers, on the 3-master Cluster


def test_snoozes_and_holds_on_the_cluster(cluster_broker, prefix, redis_client):
    from django_rtq.broker.inspect import Inspector

    inspector = Inspector(cluster_broker)
    queues = {"emails": 1, "search": 1, "billing": 1}  # one queue per node
    worker = Worker(broker=cluster_broker, queues=queues, concurrency=4)
    worker.start()
    try:
        naps = [tasks.snoozes_once.using(queue=q).prepare(f"cl-{q}", 0.3) for q in queues]
        first = tasks.calls_api.using(queue="billing").prepare("cl-api", 1.0)
        cluster_broker.enqueue([*naps, first])
        for nap in naps:
            done = wait_state(inspector, nap.id, TaskState.COMPLETED)
            assert (done.attempt.retried, done.attempt.snoozed) == (0, 1)
        wait_state(inspector, first.id, TaskState.SCHEDULED)
        (until_ms,) = held_types(cluster_broker, "billing").values()
        cluster_broker.enqueue([tasks.calls_api.using(queue="billing").prepare("cl-api") for _ in range(2)])
        wait_for(lambda: len(reports(redis_client, "cl-api")) == 3, timeout=10)
    finally:
        worker.stop()
    assert min(float(at) for at in reports(redis_client, "cl-api")) >= until_ms / 1000 - 0.01
    assert [reports(redis_client, f"cl-{q}") for q in queues] == [["0"]] * 3

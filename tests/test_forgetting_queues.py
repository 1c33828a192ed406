"""Queues nothing uses and the project names nowhere (a typo's) are forgotten: by the janitor
after FORGET_EMPTY_QUEUES_AFTER, or at once by `rtq_forget_queue`; a task enqueued to one lists it
again, even one enqueued as it was forgotten."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from prometheus_client import CollectorRegistry, generate_latest

from django_rtq.broker import Broker, TaskState, forgetting
from django_rtq.broker.broker import QUEUE_REGISTRATION_SECONDS
from django_rtq.broker.inspect import Inspector
from django_rtq.metrics.collector import RTQCollector
from django_rtq.operations import Operations
from django_rtq.worker.janitor import Janitor
from tests.support.commands import run
from tests.support.factories import WORKER, claim_ids, done, fail, message
from tests.support.polling import wait_for

TYPO = "emials"  # named nowhere: not in the test settings' QUEUES, no task type's queue
GRACE = 3600.0


def janitor(broker: Broker, grace: float | None = GRACE) -> Janitor:
    return Janitor(
        broker=broker,
        queues=["default"],
        interval=1,
        archive_max_age=GRACE,
        archive_max_size=100,
        forget_queues_after=grace,
    )


def ran_and_finished(broker: Broker, queue: str = TYPO) -> str:
    """Enqueue a task to `queue`, claim it and complete it: the queue is left with no task."""
    task = message(queue)
    broker.enqueue([task])
    [task_id] = claim_ids(broker, queue)
    broker.complete(queue, [done(task_id)], worker_id=WORKER)
    return task_id


def keys_of(broker: Broker, queue: str) -> list[str]:
    return sorted(broker.client.scan_iter(f"{broker.queue(queue).prefix}*"))


def test_an_unused_queue_named_nowhere_is_forgotten_after_the_grace_and_not_before(rtq, clock):
    ran_and_finished(rtq)
    sweeper = janitor(rtq)

    assert sweeper.forget_unused_queues() == []  # notes since when it is unused
    clock.advance(GRACE - 1)
    assert sweeper.forget_unused_queues() == []
    assert TYPO in rtq.known_queues()
    clock.advance(1)
    assert sweeper.forget_unused_queues() == [TYPO]

    assert TYPO not in rtq.known_queues()
    # What is left of it: today's counter of processed tasks, which expires by itself.
    left = keys_of(rtq, TYPO)
    assert left == [rtq.queue(TYPO).processed("2023-11-14")]
    assert rtq.client.ttl(left[0]) > 0


def test_a_use_within_the_grace_starts_it_again(rtq, clock):
    sweeper = janitor(rtq)
    ran_and_finished(rtq)
    sweeper.forget_unused_queues()
    clock.advance(GRACE / 2)
    rtq.enqueue([message(TYPO)])
    assert sweeper.forget_unused_queues() == []  # in use: the note is dropped
    rtq.complete(TYPO, [done(task_id) for task_id in claim_ids(rtq, TYPO)], worker_id=WORKER)
    sweeper.forget_unused_queues()
    clock.advance(GRACE - 1)

    assert sweeper.forget_unused_queues() == []
    clock.advance(1)
    assert sweeper.forget_unused_queues() == [TYPO]


def pending(broker: Broker) -> None:
    broker.enqueue([message(TYPO)])


def archived(broker: Broker) -> None:
    broker.enqueue([message(TYPO)])
    [task_id] = claim_ids(broker, TYPO)
    fail(broker, TYPO, task_id, TaskState.ARCHIVED)


def scheduled(broker: Broker) -> None:
    broker.enqueue([message(TYPO, process_at=broker.clock() + 10 * GRACE)])


def paused(broker: Broker) -> None:
    ran_and_finished(broker)
    broker.pause(TYPO)


def unmirrored(broker: Broker) -> None:
    broker.mirror = True  # its finished task waits in the buffer for the ORM mirror
    ran_and_finished(broker)


def served(broker: Broker) -> None:
    ran_and_finished(broker)
    broker.claim(TYPO, worker_id=WORKER, limit=1, idle_for_ms=int(100 * GRACE * 1000))  # waits on it


@pytest.mark.parametrize(
    ("use", "why"),
    [
        (pending, "it holds pending tasks"),
        (archived, "it holds archived tasks"),
        (scheduled, "it holds scheduled tasks"),
        (paused, "it is paused"),
        (unmirrored, "finished tasks of it wait to be written to the ORM mirror"),
        (served, "a live worker serves it"),
    ],
)
def test_a_queue_in_use_is_kept_and_says_why(rtq, clock, use, why):
    use(rtq)
    sweeper = janitor(rtq)

    for _ in range(3):
        assert sweeper.forget_unused_queues() == []
        clock.advance(GRACE)

    assert TYPO in rtq.known_queues()
    assert forgetting.forget_now(rtq, TYPO).startswith(why)
    assert TYPO in rtq.known_queues()


@pytest.mark.parametrize("queue", ["low", "high"], ids=["in RTQ['QUEUES']", "a task type's"])
def test_a_queue_the_project_names_is_never_forgotten_nor_noted(rtq, clock, queue):
    ran_and_finished(rtq, queue)
    sweeper = janitor(rtq)

    for _ in range(3):
        assert sweeper.forget_unused_queues() == []
        clock.advance(GRACE)

    assert queue in rtq.known_queues()
    assert not rtq.client.exists(rtq.queue(queue).empty_since)


def test_nothing_is_forgotten_when_the_setting_is_none(rtq, clock):
    ran_and_finished(rtq)
    sweeper = janitor(rtq, grace=None)
    for _ in range(3):
        assert sweeper.forget_unused_queues() == []
        clock.advance(GRACE)
    assert TYPO in rtq.known_queues()


def test_a_forgotten_queue_is_listed_again_when_a_process_enqueues_to_it(rtq, clock, redis_client):
    ran_and_finished(rtq)
    assert forgetting.forget_now(rtq, TYPO) == ""
    assert TYPO not in rtq.known_queues()

    other = Broker(redis_client, prefix=rtq.keys.prefix, clock=clock)  # another process
    task = message(TYPO)
    other.enqueue([task])

    assert TYPO in rtq.known_queues()
    assert Inspector(rtq).locate([task.id]) == {task.id: (TYPO, TaskState.PENDING)}


def test_a_task_of_a_process_that_trusts_its_registration_lists_the_queue_again(rtq, clock):
    """A process registered the queue just before it was forgotten: it enqueues to it without
    registering it again for QUEUE_REGISTRATION_SECONDS, and the janitors' looks again find it."""
    sweeper = janitor(rtq, grace=10)
    ran_and_finished(rtq)
    sweeper.forget_unused_queues()
    clock.advance(10)
    assert sweeper.forget_unused_queues() == [TYPO]
    task = message(TYPO)
    rtq.enqueue([task])  # registered 10 s ago: not sent again
    assert TYPO not in rtq.known_queues()

    sweeper.forget_unused_queues()

    assert TYPO in rtq.known_queues()
    assert Inspector(rtq).locate([task.id]) == {task.id: (TYPO, TaskState.PENDING)}


def test_the_janitors_stop_looking_again_once_every_process_registers_anew(rtq, clock):
    ran_and_finished(rtq)
    forgetting.forget_now(rtq, TYPO)
    sweeper = janitor(rtq)
    clock.advance(2 * QUEUE_REGISTRATION_SECONDS - 1)
    sweeper.forget_unused_queues()
    assert rtq.client.zscore(rtq.keys.forgotten, TYPO) is not None
    clock.advance(1)
    sweeper.forget_unused_queues()
    assert rtq.client.zscore(rtq.keys.forgotten, TYPO) is None
    assert not keys_of(rtq, TYPO) or all(rtq.client.ttl(key) > 0 for key in keys_of(rtq, TYPO))


def test_a_task_enqueued_as_the_queue_is_forgotten_is_not_hidden(rtq, clock, redis_client, monkeypatch):
    """The script found the queue unused; before its name leaves the registry, another process
    registers it and enqueues a task: the janitor's look right after the removal lists it again."""
    ran_and_finished(rtq)
    other = Broker(redis_client, prefix=rtq.keys.prefix, clock=clock)
    task = message(TYPO)
    srem = rtq.client.srem

    def enqueue_first(key, *names):
        other.enqueue([task])  # its registration lands before the removal
        return srem(key, *names)

    monkeypatch.setattr(rtq.client, "srem", enqueue_first)
    assert forgetting.forget_unused(rtq, [TYPO], grace_ms=0) == [TYPO]

    assert TYPO in rtq.known_queues()
    assert Inspector(rtq).locate([task.id]) == {task.id: (TYPO, TaskState.PENDING)}


@pytest.mark.django_db
def test_a_forgotten_queue_leaves_rtq_stats_and_the_metrics(rtq, clock):
    ran_and_finished(rtq)
    sweeper = janitor(rtq)
    assert TYPO in stats_queues() and TYPO in metrics_queues()

    sweeper.forget_unused_queues()
    clock.advance(GRACE)
    assert sweeper.forget_unused_queues() == [TYPO]

    assert TYPO not in stats_queues() and TYPO not in metrics_queues()
    assert {"default", "low"} <= stats_queues()


def stats_queues() -> set[str]:
    return {row["queue"] for row in json.loads(run("rtq_stats", "--json"))["queues"]}


def metrics_queues() -> set[str]:
    registry = CollectorRegistry()
    registry.register(RTQCollector(Operations()))
    families = generate_latest(registry).decode()
    return {
        line.split('queue="')[1].split('"')[0]
        for line in families.splitlines()
        if line.startswith("rtq_tasks{")
    }


@pytest.mark.django_db
def test_rtq_forget_queue_forgets_an_unused_queue_and_refuses_others(rtq):
    ran_and_finished(rtq)
    rtq.enqueue([message("typo-with-tasks"), message("typo-with-tasks")])

    assert run("rtq_forget_queue", TYPO).strip() == f"Forgot queue {TYPO!r}."
    assert TYPO not in stats_queues()

    with pytest.raises(CommandError) as refused:
        call_command("rtq_forget_queue", "typo-with-tasks", stdout=io.StringIO())
    assert str(refused.value) == "Queue 'typo-with-tasks' cannot be forgotten: it holds pending tasks."
    with pytest.raises(CommandError, match="the project names it"):
        call_command("rtq_forget_queue", "default", stdout=io.StringIO())
    with pytest.raises(CommandError, match=f"Unknown queue {TYPO!r}"):
        call_command("rtq_forget_queue", TYPO, stdout=io.StringIO())
    assert "typo-with-tasks" in stats_queues()


@pytest.mark.django_db
def test_a_worker_forgets_an_unused_queue_by_itself(settings, broker, run_worker):
    settings.RTQ = {**settings.RTQ, "FORGET_EMPTY_QUEUES_AFTER": 0.5}
    ran_and_finished(broker)
    with run_worker():
        wait_for(lambda: TYPO not in broker.known_queues(), message="the janitor to forget the queue")
        assert "default" in Operations().queues()

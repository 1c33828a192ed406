"""Stored messages without their id and queue, beside full ones from earlier versions; generated ids."""

from __future__ import annotations

import json
import re

import pytest

from django_rtq.broker import Broker, TaskMessage, TaskState, manual
from django_rtq.mirror import mirror_batch
from django_rtq.models import FinishedTask
from django_rtq.task_options import TASK_ID_PATTERN
from tests.support.factories import WORKER
from tests.support.polling import wait_for
from tests.support.reading import state_of
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "low"
#: How a task's message is stored: as this version writes it; in full with its own id and queue,
#: as earlier versions did; in full with another id and queue, which its readers must not take.
FORMS = ["compact", "full", "full, another id and queue"]


def store_as(broker: Broker, task_id: str, form: str, queue: str = QUEUE) -> None:
    """Rewrite a task's stored message in `form` (one of FORMS)."""
    if form == "compact":
        return
    qk = broker.queue(queue)
    data = json.loads(broker.client.hget(qk.msg, task_id))
    if form == "full":
        data = {"id": task_id, **data, "queue": queue}
    else:
        data = {"id": "someone-else", **data, "queue": "elsewhere"}
    broker.client.hset(qk.msg, task_id, json.dumps(data))


def mirrored(broker: Broker, queue: str = QUEUE) -> None:
    while mirror_batch(broker, queue, worker_id=WORKER, limit=100, lock_ms=10_000):
        pass


# The stored message


def test_the_stored_message_leaves_out_the_id_and_the_queue(broker: Broker):
    message = tasks.record.using(queue=QUEUE).enqueue("stored", 1)
    raw = broker.client.hget(broker.queue(QUEUE).msg, message.id)

    assert "id" not in json.loads(raw) and "queue" not in json.loads(raw)
    assert message.id not in raw and QUEUE not in raw
    assert TaskMessage.from_json(raw, id=message.id, queue=QUEUE) == message


@pytest.mark.parametrize(
    "stored",
    [
        {"id": "a", "queue": "q"},
        {"id": "other", "queue": "elsewhere"},
        {"id": 5, "queue": ["not", "a", "string"]},  # ignored, not checked: never read
        {"id": None},
        {},
    ],
)
def test_the_id_and_queue_given_win_over_stored_ones(stored: dict):
    raw = json.dumps({**stored, "task": "t", "args": [1], "enqueued_at": 2.0})

    message = TaskMessage.from_json(raw, id="a", queue="q")

    assert message == TaskMessage(id="a", task="t", queue="q", args=[1], enqueued_at=2.0)


def test_the_id_and_queue_are_required_and_keyword_only():
    raw = '{"task":"t","enqueued_at":2.0}'
    with pytest.raises(TypeError):
        TaskMessage.from_json(raw)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        TaskMessage.from_json(raw, "a", "q")  # type: ignore[misc]


# Each form runs, archives, is mirrored and shows in the inspector


@pytest.mark.parametrize("form", FORMS)
def test_a_task_runs_and_is_mirrored_whatever_the_form_of_its_message(
    form: str, mirroring, broker: Broker, run_worker, inspector
):
    succeeds = tasks.knows_itself.using(queue=QUEUE, max_retries=0).enqueue()
    fails = tasks.always_fails.using(queue=QUEUE, max_retries=0).enqueue(f"storage-{form}")
    for message in (succeeds, fails):
        store_as(broker, message.id, form)

    with run_worker(queues={QUEUE: 1}):
        wait_for(lambda: FinishedTask.objects.count() == 2, message="both tasks mirrored")

    done = inspector.get_task(succeeds.id)
    assert (done.state, done.result) == (
        TaskState.COMPLETED,
        {"id": succeeds.id, "task": succeeds.task, "queue": QUEUE, "retried": 0},
    )
    assert (done.message.id, done.message.queue) == (succeeds.id, QUEUE)
    failed = inspector.get_task(fails.id, QUEUE)
    assert (failed.state, failed.info["error_type"]) == (TaskState.ARCHIVED, "builtins.ValueError")
    assert (failed.message.id, failed.message.queue, failed.message.args) == (fails.id, QUEUE, fails.args)
    rows = {row.task_id: row for row in FinishedTask.objects.all()}
    assert sorted(rows) == sorted([succeeds.id, fails.id])
    assert (rows[succeeds.id].status, rows[succeeds.id].queue, rows[succeeds.id].task_name) == (
        "succeeded",
        QUEUE,
        succeeds.task,
    )
    assert (rows[fails.id].status, rows[fails.id].queue, rows[fails.id].args) == ("failed", QUEUE, fails.args)


@pytest.mark.parametrize("form", FORMS)
def test_a_task_archived_by_hand_is_mirrored_and_shown_whatever_the_form_of_its_message(
    form: str, mirroring, broker: Broker, inspector
):
    message = tasks.record.using(queue=QUEUE, priority=7).enqueue("by-hand", 2)
    store_as(broker, message.id, form)

    [pending] = inspector.list_tasks(QUEUE, TaskState.PENDING)
    assert pending.message == message
    assert inspector.queue_stats(QUEUE).oldest_pending_age is not None
    assert manual.archive(broker, QUEUE, [message.id]) == 1
    mirrored(broker)

    archived = inspector.get_task(message.id)
    assert (archived.state, archived.queue, archived.message) == (TaskState.ARCHIVED, QUEUE, message)
    row = FinishedTask.objects.get(pk=message.id)
    assert (row.queue, row.task_name, row.args, row.priority) == (QUEUE, message.task, ["by-hand", 2], 7)


@pytest.mark.parametrize("form", FORMS)
def test_a_unique_task_archived_by_hand_releases_its_lock_whatever_the_form_of_its_message(
    form: str, broker: Broker
):
    message = tasks.record.using(queue=QUEUE, unique=True).enqueue("unique", 3)
    store_as(broker, message.id, form)

    assert manual.archive(broker, QUEUE, [message.id]) == 1

    again = tasks.record.using(queue=QUEUE, unique=True).enqueue("unique", 3)
    assert state_of(broker, QUEUE, again.id) == "pending"


# Task ids


def test_a_task_id_of_your_own_still_works(broker: Broker, run_worker, inspector):
    own = "report:2026-05.eu@1~x"
    message = tasks.knows_itself.using(queue=QUEUE, max_retries=0, task_id=own).enqueue()
    assert message.id == own

    with run_worker(queues={QUEUE: 1}):
        wait_for(lambda: state_of(broker, QUEUE, own) == "completed", message="the task to complete")

    task = inspector.get_task(own)
    assert task.result["id"] == own and task.message.id == own
    assert own not in broker.client.hget(broker.queue(QUEUE).msg, own)


def test_generated_ids_are_22_url_safe_characters_and_unique():
    ids = [tasks.noop.prepare().id for _ in range(100_000)]

    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{22}", task_id) for task_id in ids)
    assert all(TASK_ID_PATTERN.fullmatch(task_id) for task_id in ids)
    assert not any(task_id.startswith("-") for task_id in ids)  # a command line takes it for an option

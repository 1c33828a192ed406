"""The one-task enqueue path, the compact stored message and what reads it, and the enqueue script."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_rtq.broker import Broker, TaskMessage, TaskState, manual
from django_rtq.broker.keys import ENQUEUE_KEYS
from django_rtq.broker.scripts import LUA_DIR
from django_rtq.exceptions import DuplicateTask, TaskIdConflict
from tests.support.factories import BILLING, EMAILS, WORKER, claim_ids, message
from tests.support.reading import column, ids_in, next_message, state_of, subscribed


def full_json(task: TaskMessage) -> str:
    """The message as earlier versions stored it: every field, nulls and defaults included."""
    return json.dumps(
        {f.name: getattr(task, f.name) for f in dataclasses.fields(TaskMessage)}, separators=(",", ":")
    )


# One task, one script call


def refusal(call) -> tuple[type, str]:
    with pytest.raises((TaskIdConflict, DuplicateTask)) as caught:
        call()
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("taken", "error"),
    [("id", TaskIdConflict), ("unique key", DuplicateTask), ("id and unique key", TaskIdConflict)],
)
def test_one_task_is_refused_as_a_call_of_several_refuses_it(any_broker: Broker, taken: str, error: type):
    holder = message(EMAILS, unique_key="report", unique_ttl=60)
    any_broker.enqueue([holder])
    fields: dict[str, Any] = {}
    if "id" in taken:
        fields["id"] = holder.id
    if "unique key" in taken:
        fields |= {"unique_key": "report", "unique_ttl": 60}
    latecomer = message(EMAILS, **fields)

    alone = refusal(lambda: any_broker.enqueue([latecomer]))
    with_another = refusal(lambda: any_broker.enqueue([latecomer, message(EMAILS)]))

    assert alone == with_another
    assert alone[0] is error
    assert ids_in(any_broker, EMAILS, TaskState.PENDING) == [holder.id]


def test_one_task_is_one_script_call_without_a_pipeline(any_broker: Broker, monkeypatch):
    any_broker.register_queues([EMAILS])
    sent = []
    execute = any_broker.client.execute_command

    def recording(*command, **options):
        sent.append(command[0])
        return execute(*command, **options)

    monkeypatch.setattr(any_broker.client, "execute_command", recording)
    monkeypatch.setattr(any_broker.client, "pipeline", lambda *a, **k: pytest.fail("a pipeline for one task"))
    task = message(EMAILS)

    any_broker.enqueue([task])

    assert sent == ["EVALSHA"]
    assert state_of(any_broker, EMAILS, task.id) == "pending"


def test_one_task_registers_its_queue(any_broker: Broker):
    any_broker.enqueue([message(BILLING)])

    assert any_broker.known_queues() == [BILLING]


def test_one_task_is_enqueued_where_the_script_is_not_loaded(any_broker: Broker, monkeypatch):
    unknown = dataclasses.replace(any_broker.scripts["enqueue"], sha="0" * 40)
    monkeypatch.setattr(any_broker, "scripts", {**any_broker.scripts, "enqueue": unknown})
    task = message(EMAILS)

    any_broker.enqueue([task])

    assert state_of(any_broker, EMAILS, task.id) == "pending"


def test_the_enqueue_keys_are_those_the_script_header_names_in_its_order(any_broker: Broker):
    header = (LUA_DIR / "enqueue.lua").read_text()
    named = re.findall(r"^-- KEYS\[\d+\] -> rtq:\{<queue>\}:(\w+)$", header, re.MULTILINE)
    qk = any_broker.queue(EMAILS)

    assert tuple(named) == ENQUEUE_KEYS
    assert qk.enqueue_keys == tuple(getattr(qk, name) for name in ENQUEUE_KEYS)


# The stored message


def test_a_message_is_stored_without_the_fields_at_their_default():
    task = TaskMessage(id="a", task="t", queue="q", max_retries=5, timeout=1800.0, enqueued_at=1.5)

    assert task.to_json() == '{"task":"t","max_retries":5,"timeout":1800.0,"enqueued_at":1.5}'
    assert TaskMessage.from_json(task.to_json(), id="a", queue="q") == task


def test_enqueued_at_is_stored_even_at_zero():
    assert TaskMessage(id="a", task="t", queue="q").to_json() == '{"task":"t","enqueued_at":0.0}'


def test_values_that_only_look_like_defaults_are_kept_in_field_order():
    task = TaskMessage(
        id="a", task="t", queue="q", args=[None], kwargs={"k": 0}, priority=-1, max_retries=1, timeout=0.0,
        deadline=0.0, retention=0.5, unique_key="", unique_ttl=0.0, enqueued_at=2.0, process_at=0.0,
        parent="", parent_queue="", position=0,
    )  # fmt: skip
    stored = json.loads(task.to_json())

    assert list(stored) == [f.name for f in dataclasses.fields(TaskMessage) if f.name not in ("id", "queue")]
    assert TaskMessage.from_json(task.to_json(), id="a", queue="q") == task


def test_a_message_stored_in_full_by_an_earlier_version_still_parses():
    task = message(EMAILS, args=[1], priority=3, max_retries=2, timeout=10.0)
    old = full_json(task)

    assert '"deadline":null' in old and '"parent":null' in old
    assert TaskMessage.from_json(old, id=task.id, queue=task.queue) == task


@pytest.mark.parametrize(
    "raw",
    [
        '{"id":"a","queue":"q"}',  # no task
        '{"id":"a","task":"t","queue":"q","priority":101}',
        '{"id":"a","task":"t","queue":"q","max_retries":-1}',
        '{"id":"a","task":"t","queue":"q","args":{}}',
        '{"id":"a","task":"t","queue":"q","position":1.5}',
        '{"id":"a","task":"t","queue":"q","colour":"red"}',
    ],
)
def test_a_compact_message_is_checked_as_a_full_one_is(raw: str):
    with pytest.raises(ValueError, match="task message"):
        TaskMessage.from_json(raw, id="a", queue="q")


# What reads a stored message: a missing field reads as a null one


def child_of(workflow_id: str, position: int | str, **fields) -> TaskMessage:
    return message(
        EMAILS,
        id=f"{workflow_id}.{position}",
        parent=workflow_id,
        parent_queue=BILLING,
        position=position,
        **fields,
    )


def archived_by_hand(broker: Broker, tasks: list[TaskMessage], *, full: bool) -> None:
    """Enqueue the tasks, stored compact or (`full`) as earlier versions did, and archive them."""
    broker.enqueue(tasks)
    if full:
        for task in tasks:
            broker.client.hset(broker.queue(EMAILS).msg, task.id, full_json(task))
    assert manual.archive(broker, EMAILS, [task.id for task in tasks]) == len(tasks)


def child_notice(broker: Broker, task_id: str) -> dict[str, Any] | None:
    raw = broker.client.hget(broker.queue(EMAILS).command, f"child:{task_id}")
    return json.loads(raw) if raw else None


@pytest.mark.parametrize("position", [0, 3, "d1"])
def test_an_archived_child_tells_its_workflow_the_same_whatever_the_form_of_its_message(
    any_broker: Broker, position: int | str
):
    compact, full = child_of("wf-compact", position), child_of("wf-full", position)
    archived_by_hand(any_broker, [compact], full=False)
    archived_by_hand(any_broker, [full], full=True)

    told = {"compact": child_notice(any_broker, compact.id), "full": child_notice(any_broker, full.id)}

    for form, task in [("compact", compact), ("full", full)]:
        assert told[form] is not None, form
        assert told[form]["to"] == task.parent and told[form]["child"] == task.id
    assert {**told["compact"], "to": "", "child": ""} == {**told["full"], "to": "", "child": ""}
    assert told["compact"]["to_queue"] == BILLING and told["compact"]["pos"] == position
    assert told["compact"]["ok"] is False and told["compact"]["error"]["message"] == "archived by hand"


def test_an_archived_task_without_a_workflow_tells_nobody_whatever_the_form_of_its_message(
    any_broker: Broker,
):
    compact, full = message(EMAILS), message(EMAILS)
    archived_by_hand(any_broker, [compact], full=False)
    archived_by_hand(any_broker, [full], full=True)

    assert '"parent"' not in column(any_broker, EMAILS, "msg", compact.id)
    assert child_notice(any_broker, compact.id) is None and child_notice(any_broker, full.id) is None
    assert any_broker.client.zcard(any_broker.queue(EMAILS).commands) == 0
    assert set(ids_in(any_broker, EMAILS, TaskState.ARCHIVED)) == {compact.id, full.id}


def test_the_mirror_reads_a_compact_record_as_a_full_one(any_broker: Broker):
    from django_rtq.mirror import values_from_record

    any_broker.mirror = True
    compact, full = child_of("wf-1", 0, args=[1], priority=2), child_of("wf-2", 0, args=[1], priority=2)
    archived_by_hand(any_broker, [compact], full=False)
    archived_by_hand(any_broker, [full], full=True)
    finished = any_broker.queue(EMAILS).finished

    rows = {
        task.id: values_from_record(task.id, EMAILS, any_broker.client.hget(finished, task.id))
        for task in (compact, full)
    }

    unlike = {"task_id", "parent_id", "finished_at", "started_at"}
    assert {k: v for k, v in rows[compact.id].items() if k not in unlike} == {
        k: v for k, v in rows[full.id].items() if k not in unlike
    }
    assert rows[compact.id]["parent_id"] == "wf-1" and rows[compact.id]["priority"] == 2
    assert rows[compact.id]["args"] == [1] and rows[compact.id]["kwargs"] == {}


@pytest.mark.parametrize("full", [False, True])
def test_run_now_knows_a_workflow_by_its_compact_or_full_message(any_broker: Broker, full: bool):
    workflow = TaskMessage(id="wf", task="django_rtq.group", queue=EMAILS)
    qk = any_broker.queue(EMAILS)
    any_broker.client.hset(qk.msg, workflow.id, full_json(workflow) if full else workflow.to_json())
    any_broker.client.hset(qk.state, workflow.id, "archived")
    any_broker.client.zadd(qk.archived, {workflow.id: 1})

    assert manual.run_now(any_broker, EMAILS, [workflow.id]) == 0
    assert state_of(any_broker, EMAILS, workflow.id) == "archived"


# Order, wake-ups and hand-offs


def test_tasks_enqueued_one_by_one_run_by_priority_then_in_enqueue_order(any_broker: Broker):
    tasks = [message(EMAILS, priority=p) for p in (0, 5, -3, 5, 0, 100, -100, -3)]
    for task in tasks[:4]:
        any_broker.enqueue([task])
    any_broker.enqueue(tasks[4:6])
    for task in tasks[6:]:
        any_broker.enqueue([task])

    run_order = sorted(tasks, key=lambda task: -task.priority)  # stable: FIFO within a priority
    assert claim_ids(any_broker, EMAILS) == [task.id for task in run_order]


def test_a_task_given_back_goes_to_the_front_of_its_own_priority(any_broker: Broker):
    high, other_high, low = message(EMAILS, priority=7), message(EMAILS, priority=7), message(EMAILS)
    for task in (high, other_high, low):
        any_broker.enqueue([task])
    assert claim_ids(any_broker, EMAILS, limit=1) == [high.id]

    assert any_broker.requeue(EMAILS, [high.id], worker_id=WORKER) == 1

    assert claim_ids(any_broker, EMAILS) == [high.id, other_high.id, low.id]


def wake_ups(broker: Broker, enqueue) -> int:
    """How many times `enqueue()` publishes on EMAILS's wake channel (told by a message of ours
    published after it: messages of one channel arrive in order)."""
    channel = broker.queue(EMAILS).wake_channel
    with subscribed(broker, channel) as pubsub:
        enqueue()
        broker.client.publish(channel, "end")
        count = 0
        while next_message(pubsub)["data"] != "end":
            count += 1
    return count


def test_a_wake_up_only_when_pending_goes_from_empty_to_not(broker: Broker):
    later = broker.server_now_ms() / 1000 + 3600

    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS, process_at=later)])) == 0
    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS) for _ in range(3)])) == 1
    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS)])) == 0
    claim_ids(broker, EMAILS)
    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS)])) == 1
    claim_ids(broker, EMAILS)
    taken = ids_in(broker, EMAILS, TaskState.ACTIVE)[0]
    with pytest.raises(TaskIdConflict):
        wake_ups(broker, lambda: broker.enqueue([message(EMAILS, id=taken)]))
    assert ids_in(broker, EMAILS, TaskState.PENDING) == []


def test_one_call_hands_a_task_to_each_idle_worker_and_queues_the_rest(broker: Broker):
    qk = broker.queue(EMAILS)
    listeners = []
    try:
        for worker in ("w1", "w2"):
            pubsub = broker.client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(qk.handoff_channel(worker))
            listeners.append(pubsub)
        for worker in ("w1", "w2"):
            assert broker.claim(EMAILS, worker_id=worker, limit=1, idle_for_ms=5_000) == []
        tasks = [message(EMAILS) for _ in range(3)]

        assert wake_ups(broker, lambda: broker.enqueue(tasks)) == 1

        assert {broker.client.hget(qk.owner, task.id) for task in tasks[:2]} == {"w1", "w2"}
        assert [state_of(broker, EMAILS, task.id) for task in tasks] == ["active", "active", "pending"]
        assert ids_in(broker, EMAILS, TaskState.PENDING) == [tasks[2].id]
        assert broker.client.zcard(qk.idle) == 0
    finally:
        for pubsub in listeners:
            pubsub.close()


def test_on_the_servers_clock_a_past_process_at_is_pending_and_a_future_one_scheduled(broker: Broker):
    now = broker.server_now_ms() / 1000
    past, future, plain = (
        message(EMAILS, process_at=now - 60),
        message(EMAILS, process_at=now + 3600),
        message(EMAILS),
    )
    for task in (past, future, plain):
        broker.enqueue([task])

    assert [state_of(broker, EMAILS, t.id) for t in (past, future, plain)] == [
        "pending",
        "scheduled",
        "pending",
    ]
    assert ids_in(broker, EMAILS, TaskState.PENDING) == [past.id, plain.id]


# The django.tasks backend


def test_a_django_task_is_validated_once_and_each_enqueue_still_honours_run_after(
    broker: Broker, monkeypatch
):
    from tests.testapp import dtasks

    backend = dtasks.multiply.get_backend()
    backend._known_task_types.clear()
    validated = []
    validate = type(backend).validate_task
    monkeypatch.setattr(
        type(backend), "validate_task", lambda self, task: validated.append(task) or validate(self, task)
    )

    first, second = dtasks.multiply.enqueue(2, 3), dtasks.multiply.enqueue(4, 5)
    later = dtasks.multiply.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(6, 7)

    assert validated.count(dtasks.multiply) == 1
    states = [state_of(broker, "default", result.id) for result in (first, second, later)]
    assert states == ["pending", "pending", "scheduled"]
    stored = column(broker, "default", "msg", second.id)
    assert TaskMessage.from_json(stored, id=second.id, queue="default").args == [4, 5]


class FixedBackoff:
    """A retry backoff that is not hashable (it compares by value)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, retried: int, exc: BaseException) -> float:
        return self.seconds

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedBackoff) and other.seconds == self.seconds

    __hash__ = None  # type: ignore[assignment]


def backed_off(a: int) -> int:
    return a


def test_a_django_task_with_an_option_that_cannot_be_hashed_is_enqueued(broker: Broker):
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2 with the django-tasks backport
        from django_tasks import task

    django_task = task(retry_backoff=FixedBackoff(1))(backed_off)
    results = [django_task.enqueue(1), django_task.enqueue(2)]

    assert [state_of(broker, "default", result.id) for result in results] == ["pending", "pending"]

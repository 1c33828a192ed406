"""A task's message is stored compact (no field at its default), a full one of an earlier version
still parses, and every reader takes a missing field for a null one."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from django_rtq.broker import Broker, TaskMessage, TaskState, manual
from tests.support.factories import BILLING, EMAILS, message
from tests.support.reading import column, ids_in, state_of


def full_json(task: TaskMessage) -> str:
    """The message as earlier versions stored it: every field, nulls and defaults included."""
    return json.dumps(
        {f.name: getattr(task, f.name) for f in dataclasses.fields(TaskMessage)}, separators=(",", ":")
    )


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
        parent="", parent_queue="", position=0, trace={}, debounce=0.001, debounce_key="", merged_enqueues=1,
        partition="0", partition_weight=2,
    )  # fmt: skip
    stored = json.loads(task.to_json())

    first = ["partition", "partition_weight"]  # right after "v", where the scripts read them
    fields = [f.name for f in dataclasses.fields(TaskMessage) if f.name not in ("id", "queue", *first)]
    assert list(stored) == [fields[0], "v", *first, *fields[1:]]
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


def test_a_parsed_message_is_the_one_its_fields_make_and_owns_its_arguments():
    """from_json sets the fields itself, past the dataclass's __init__: the same message as
    that would make, each with lists and dicts of its own, and as immutable."""
    for raw in ['{"task":"t"}', '{"task":"t","args":[1],"kwargs":{"k":2},"v":2,"trace":{"a":"b"}}']:
        fields = json.loads(raw)
        fields.pop("v", None)
        first, second = (TaskMessage.from_json(raw, id="a", queue="q") for _ in range(2))
        assert first == TaskMessage(id="a", queue="q", **fields)
        assert first.args is not second.args and first.kwargs is not second.kwargs
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.task = "u"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ('{"args":[]}', "missing 1 required keyword-only argument: 'task'"),
        ('{"task":"t","colour":"red"}', "unexpected keyword argument 'colour'"),
        ('{"task":"t","args":null}', "field 'args' is None, not of type list"),
    ],
)
def test_a_wrong_message_is_told_as_the_constructor_tells_it(raw: str, error: str):
    with pytest.raises(ValueError, match=error):
        TaskMessage.from_json(raw, id="a", queue="q")


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (' {"task":"t"}\n', None),  # whitespace around it: parsed as ever
        (b'{"task":"t"}', None),
        ('\ufeff{"task":"t"}', "Unexpected UTF-8 BOM"),
        ('{"task":"t"} {}', "Extra data"),
        ("", "Expecting value"),
    ],
)
def test_a_message_is_parsed_as_json_loads_parses_it(raw: str | bytes, error: str | None):
    if error is None:
        assert TaskMessage.from_json(raw, id="a", queue="q").task == "t"
    else:
        with pytest.raises(json.JSONDecodeError, match=error):
            TaskMessage.from_json(raw, id="a", queue="q")


def test_a_message_of_an_old_format_with_a_later_field_is_refused_whatever_its_form():
    for raw in ['{"task":"t","partition":"p"}', '{"task":"t","v":2,"debounce":1.0}']:
        with pytest.raises(ValueError, match="has fields of a later one"):
            TaskMessage.from_json(raw, id="a", queue="q")
    # at their defaults they are none: a message stored in full has them all
    assert TaskMessage.from_json('{"task":"t","partition":null,"merged_enqueues":0}', id="a", queue="q")


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

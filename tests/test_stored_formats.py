"""Stored formats (broker/versions.py): the golden fixtures of every version (tests/data/formats/)
run on the current worker, the current writers write the shapes of the current version, a
reader refuses a format newer than its own as NewerFormat (never as corrupt), and every writer
keeps the version it found."""

from __future__ import annotations

import json
import logging
import re
from contextlib import contextmanager
from dataclasses import replace

import pytest
from django.contrib.auth.models import User

from django_rtq.broker import TaskMessage, TaskState, manual
from django_rtq.broker import message as message_module
from django_rtq.broker.attempt import AttemptInfo, check_info_version, info_version, parse_info
from django_rtq.broker.message import FIELD_SINCE
from django_rtq.broker.scripts import LUA_DIR
from django_rtq.broker.states import Action
from django_rtq.broker.versions import INFO_FORMAT, MESSAGE_FORMAT, WORKFLOW_FORMAT, NewerFormat
from django_rtq.broker.waiting import NEWER_FORMAT, waiting_for_worker
from django_rtq.broker.workflow import NewerWorkflow, cancel_workflow, child_outcome, start_postponed
from django_rtq.connection import get_broker, reset_broker
from django_rtq.operations import NEWER_WORKFLOW_REASON, Operations
from django_rtq.worker.commander import CommandRetries
from django_rtq.worker.processor import abilities
from django_rtq.workflows import apply_due, chain, group
from tests.support.factories import EMAILS, WORKER, claim_ids, enqueue
from tests.support.polling import wait_for
from tests.support.runs import reports, task_state
from tests.support.stored_formats import (
    SHAPES,
    TRACE_PARENT,
    build_shape,
    current_dir,
    load_keys,
    newest_fixture,
    read_keys,
    version_dirs,
)
from tests.testapp import tasks
from tests.testapp.wf_tasks import add, mark, mul

KEEP = 60

# The golden fixtures


def fixtures() -> list[dict]:
    """Every fixture of every version, oldest version first."""
    return [
        json.loads(path.read_text())
        for directory in version_dirs()
        for path in sorted(directory.glob("*.json"))
        if path.name != "formats.json"
    ]


def check_task(inspector, redis_client, task_id: str, expected: dict) -> None:
    """The task reads as `expected` says: its state, result, and info facts ("errors": how
    many); gone (state None) with what stored_shape `reported`."""
    if expected["state"] is None:
        assert reports(redis_client, f"stored_shape:{task_id}") == [
            json.dumps(expected["reported"], sort_keys=True)
        ]
        return
    task = inspector.get_task(task_id)
    assert task.state == expected["state"], task_id
    if "result" in expected:
        assert task.result == expected["result"], task_id
    info = task.attempt.as_dict()
    for fact, value in expected.items():
        if fact == "errors":
            assert len(task.attempt.error_records) == value, task_id
        elif fact not in ("state", "result", "reported"):
            assert info.get(fact) == value, (task_id, fact, info)


def test_the_fixtures_of_every_version_run_on_the_current_worker(
    broker, inspector, prefix, redis_client, run_worker
):
    loaded = fixtures()
    assert {fixture["shape"] for fixture in loaded} >= {shape.name for shape in SHAPES}
    for fixture in loaded:
        load_keys(redis_client, prefix, fixture["keys"])
    for fixture in loaded:
        for task_id, expected in fixture.get("stored", {}).items():
            check_task(inspector, redis_client, task_id, expected)
    for fixture in loaded:
        assert manual.run_now(broker, "default", fixture.get("run_now", [])) == len(
            fixture.get("run_now", [])
        )
    expectations = {task_id: e for fixture in loaded for task_id, e in fixture.get("ran", {}).items()}
    with run_worker(queues={"default": 4}):
        for task_id, expected in expectations.items():
            wait_for(
                lambda: task_state(inspector, task_id) == expected["state"],  # noqa: B023
                timeout=20,
                message=f"{task_id} to be {expected['state']}",
            )
    for task_id, expected in expectations.items():
        check_task(inspector, redis_client, task_id, expected)
    for key in redis_client.scan_iter(f"{prefix}:{{default}}:unique:*"):
        raise AssertionError(f"a uniqueness lock is left: {key}")


def test_the_current_writers_write_the_shapes_of_the_current_version(settings, redis_client, prefix):
    directory = current_dir()
    assert directory is not None, (
        "no fixtures of the current formats (django_rtq/broker/versions.py) in tests/data/formats/: "
        "generate them into a new version's directory (python -m tests.support.stored_formats)"
    )
    test_settings = settings.RTQ

    @contextmanager
    def broker_for(shape_prefix: str):
        settings.RTQ = {**test_settings, "KEY_PREFIX": shape_prefix}
        reset_broker()
        try:
            yield get_broker()
        finally:
            settings.RTQ = test_settings
            reset_broker()

    for shape in SHAPES:
        written = build_shape(shape, redis_client, broker_for)
        path = newest_fixture(shape.name)
        assert path is not None, (
            f"no fixture of the shape {shape.name!r}: add it with python -m tests.support.stored_formats"
        )
        stored = json.loads(path.read_text())
        assert written["keys"] == stored["keys"], (
            f"The writers changed the stored shape {shape.name!r} of format version {stored['formats']} "
            f"(tests/data/formats/{path.parent.name}/{shape.name}.json). A stored shape is a contract: "
            "raise the format version in django_rtq/broker/versions.py (and teach the readers the "
            "old one), then add the fixtures of the new version with python -m "
            "tests.support.stored_formats. Never edit the fixtures of an old version."
        )


# Messages


def test_a_message_of_a_newer_format_is_refused_before_its_fields_are_read():
    newer = {"task": "shop.tasks.pay", "v": MESSAGE_FORMAT + 1, "args": [1], "a_field_of_later": True}
    with pytest.raises(NewerFormat) as refused:
        TaskMessage.from_json(json.dumps(newer), id="t1", queue=EMAILS)
    assert (refused.value.what, refused.value.version, refused.value.readable) == (
        "message",
        MESSAGE_FORMAT + 1,
        MESSAGE_FORMAT,
    )
    assert isinstance(refused.value, ValueError)  # a worker of 0.1.0's kind would archive it


def test_a_message_of_this_format_or_an_older_one_reads_as_ever():
    for version in range(1, MESSAGE_FORMAT + 1):
        raw = json.dumps({"task": "shop.tasks.pay", "v": version, "args": [1]})
        assert TaskMessage.from_json(raw, id="t1", queue=EMAILS).args == [1]
    implicit = TaskMessage.from_json('{"task":"shop.tasks.pay","enqueued_at":5}', id="t1", queue=EMAILS)
    assert implicit.enqueued_at == 5
    with pytest.raises(ValueError, match="unexpected fields"):  # an unknown field of its own version
        TaskMessage.from_json('{"task":"x","later":1}', id="t1", queue=EMAILS)
    for garbage in ('"2"', "0", "true", "1.5"):
        with pytest.raises(ValueError) as refused:
            TaskMessage.from_json(f'{{"task":"x","v":{garbage}}}', id="t1", queue=EMAILS)
        assert not isinstance(refused.value, NewerFormat)


def test_a_message_is_written_in_the_oldest_format_that_holds_its_fields():
    plain = TaskMessage(id="t1", task="shop.tasks.pay", queue=EMAILS, args=[1], priority=5)
    assert plain.version() == 1 and '"v"' not in plain.to_json()
    traced = replace(plain, trace={"traceparent": TRACE_PARENT})
    written = traced.to_json()
    assert traced.version() == 2 == FIELD_SINCE["trace"] <= MESSAGE_FORMAT
    assert written.startswith('{"task":"shop.tasks.pay","v":2,')
    assert TaskMessage.from_json(written, id="t1", queue=EMAILS) == traced
    # A field of format 2 in a message that says format 1 is corrupt, not of a newer format.
    with pytest.raises(ValueError, match="fields of a later one") as refused:
        TaskMessage.from_json(json.dumps({"task": "x", "trace": {"a": "b"}}), id="t1", queue=EMAILS)
    assert not isinstance(refused.value, NewerFormat)
    with pytest.raises(ValueError, match="out of its range"):
        TaskMessage.from_json(json.dumps({"task": "x", "v": 2, "trace": {"a": 1}}), id="t1", queue=EMAILS)


def test_a_worker_that_reads_format_1_leaves_a_traced_message_and_runs_the_others(
    broker, inspector, run_worker, redis_client, monkeypatch
):
    """Format 2 is written only for a message that carries a trace context: a worker of a
    release that reads format 1 runs every other one, and leaves that one (never archives it)
    for a worker that reads it."""
    plain = tasks.add.using(task_id="plain").enqueue(1, 2).id
    traced = tasks.add.using(task_id="traced").enqueue(3, 4).id
    qk = broker.queue("default")
    message = TaskMessage.from_json(redis_client.hget(qk.msg, traced), id=traced, queue="default")
    redis_client.hset(qk.msg, traced, replace(message, trace={"traceparent": TRACE_PARENT}).to_json())

    with monkeypatch.context() as older_release:
        older_release.setattr(message_module, "MESSAGE_FORMAT", 1)
        older_release.setattr(abilities, "READABLE", {**abilities.READABLE, "message": 1})
        with run_worker(queues={"default": 1}):
            wait_for(lambda: task_state(inspector, plain) == TaskState.COMPLETED, message="the plain task")
            [waiting] = wait_for(lambda: waiting_for_worker(broker, "default"), message="the traced task")
    assert (waiting.why, waiting.count) == (NEWER_FORMAT, 1)
    assert waiting.reason == "its stored message is of format version 2; this release reads up to 1"
    assert task_state(inspector, traced) != TaskState.ARCHIVED

    with run_worker(queues={"default": 1}):
        wait_for(lambda: task_state(inspector, traced) == TaskState.COMPLETED, message="the traced task")
    assert inspector.get_task(traced).result == 7


# Attempt info


def test_an_info_of_a_newer_format_is_refused_and_parse_info_keeps_its_version():
    raw = json.dumps({"v": INFO_FORMAT + 1, "retried": 2, "later": {"x": 1}})
    info, problem = parse_info(raw)
    assert problem is None and info["v"] == INFO_FORMAT + 1
    assert info_version(info) == INFO_FORMAT + 1
    with pytest.raises(NewerFormat) as refused:
        check_info_version(info)
    assert (refused.value.what, refused.value.version) == ("info", INFO_FORMAT + 1)
    check_info_version({})  # absent: version 1
    check_info_version({"v": INFO_FORMAT})
    assert info_version({}) == 1
    with pytest.raises(ValueError, match="not a positive integer"):
        info_version({"v": "2"})
    assert parse_info('{"v":"x"}') == ({"v": "x"}, None)  # never raises: the check does


def test_the_python_writers_of_an_info_keep_its_version_and_unknown_facts():
    stored = AttemptInfo.from_mapping({"v": 7, "later": [1], "retried": 1})
    for written in (
        stored.succeeded(WORKER, 10.0, 11.0),
        stored.failed(ValueError("x"), "tb", worker_id=WORKER, started_at=10, failed_at=11, retrying=True),
    ):
        assert (written["v"], written["later"]) == (7, [1])


def test_the_lua_writers_of_an_info_keep_its_version_and_unknown_facts(broker, redis_client):
    qk = broker.queue(EMAILS)
    archived, recovered = enqueue(broker, EMAILS, 2)
    facts = json.dumps({"v": 7, "later": {"a": [1, 2]}})
    redis_client.hset(qk.info, mapping={archived: facts, recovered: facts})
    assert manual.archive(broker, EMAILS, [archived]) == 1
    assert claim_ids(broker, EMAILS, lease=0.001) == [recovered]
    wait_for(lambda: broker.recover(EMAILS, grace_ms=0, max_recoveries=5), message="its lease to lapse")
    for task_id, fact in ((archived, "error"), (recovered, "recovered")):
        info = json.loads(redis_client.hget(qk.info, task_id))
        assert (info["v"], info["later"]) == (7, {"a": [1, 2]}) and fact in info


# Workflow hashes


def test_the_lua_helpers_read_the_workflow_format_of_versions_py():
    lib = (LUA_DIR / "_lib.lua").read_text()
    assert int(re.search(r"^local WORKFLOW_FORMAT = (\d+)$", lib, re.MULTILINE).group(1)) == WORKFLOW_FORMAT


def newer(redis_client, broker, workflow_id: str) -> None:
    """Make a waiting workflow's hash one of the next format."""
    redis_client.hset(broker.queue("default").workflow(workflow_id), "v", WORKFLOW_FORMAT + 1)


def snapshot(redis_client, prefix: str) -> dict[str, object]:
    """Every key of the test, with what it holds."""
    return read_keys(redis_client, f"{prefix}:")


def test_the_scripts_refuse_a_workflow_of_a_newer_format_and_change_nothing(broker, redis_client, prefix):
    workflow_id = chain(mark.s("newer", 1), mark.s("newer", 2), retention=KEEP).enqueue()
    postponed = group(mark.s("newer", 3)).using(delay=60).enqueue()
    newer(redis_client, broker, workflow_id)
    newer(redis_client, broker, postponed)
    before = snapshot(redis_client, prefix)
    outcome = {"cmd_id": "c", "position": 0, "ok": True, "payload_json": "1"}
    calls = (
        lambda: child_outcome(broker, "default", workflow_id, **outcome),
        lambda: cancel_workflow(broker, "default", workflow_id, error_type="x", message="y"),
        lambda: start_postponed(broker, "default", postponed, cmd_id=f"start:{postponed}"),
    )
    for call in calls:
        with pytest.raises(NewerWorkflow) as refused:
            call()
        assert isinstance(refused.value, NewerFormat)
        assert (refused.value.what, refused.value.version, refused.value.readable) == (
            "workflow",
            WORKFLOW_FORMAT + 1,
            WORKFLOW_FORMAT,
        )
        assert snapshot(redis_client, prefix) == before


def test_a_command_for_a_workflow_of_a_newer_format_waits_for_a_newer_worker(
    broker, inspector, run_worker, redis_client, monkeypatch, caplog
):
    workflow_id = chain(add.s(2, 3), mul.s(10), retention=KEEP).enqueue()
    newer(redis_client, broker, workflow_id)
    qk = broker.queue("default")
    command = f"child:{workflow_id}.0"
    with caplog.at_level(logging.WARNING, logger="django_rtq"), run_worker(queues={"default": 1}):
        # The first step runs; its outcome's command is taken, refused, and left leased.
        wait_for(
            lambda: (redis_client.zscore(qk.commands, command) or 0) > broker.now_ms(),
            message="the command to be taken and left",
        )
    lease_end = redis_client.zscore(qk.commands, command)
    assert redis_client.hget(qk.workflow(workflow_id), "done") == "0"  # not applied
    assert inspector.get_task(workflow_id).state == TaskState.WAITING
    assert redis_client.zscore(qk.applied, command) is None
    left = [r for r in caplog.records if "left for a newer worker" in r.getMessage()]
    assert len(left) == 1 and workflow_id in left[0].getMessage()

    # Taken again only once its lease lapsed; refused again, and not logged again.
    retries = CommandRetries(broker, logging.getLogger("test"))
    assert apply_due(broker, ["default"], retry=retries) == 0
    assert redis_client.zscore(qk.commands, command) == lease_end
    now = broker.clock()
    monkeypatch.setattr(broker, "clock", lambda: now + 31)
    assert apply_due(broker, ["default"], retry=retries) == 0
    assert redis_client.zscore(qk.commands, command) > lease_end
    assert len([r for r in caplog.records if "left for a newer worker" in r.getMessage()]) == 1

    # A worker that reads it (here: the hash made of this format again) applies it.
    redis_client.hdel(qk.workflow(workflow_id), "v")
    monkeypatch.setattr(broker, "clock", lambda: now + 62)
    assert apply_due(broker, ["default"], retry=retries) >= 1
    assert redis_client.hget(qk.workflow(workflow_id), "done") == "1"
    monkeypatch.undo()
    with run_worker(queues={"default": 1}):
        done = wait_for(
            lambda: (task := inspector.get_task(workflow_id)).state != TaskState.WAITING and task,
            message="the workflow to finish",
        )
    assert (done.state, done.result) == (TaskState.COMPLETED, 50)


@pytest.mark.django_db
def test_cancelling_or_deleting_a_workflow_of_a_newer_format_by_hand_is_refused_with_the_reason(
    broker, redis_client, prefix
):
    workflow_id = chain(mark.s("newer", 1), mark.s("newer", 2), retention=KEEP).enqueue()
    newer(redis_client, broker, workflow_id)
    before = snapshot(redis_client, prefix)
    ops = Operations(User.objects.create_superuser("root", "root@example.com", None))
    for action in (Action.CANCEL, Action.DELETE):
        report = ops.act(action, [workflow_id])
        assert report.count == 0
        assert [reason for _, reason in report.skipped] == [NEWER_WORKFLOW_REASON]
    assert snapshot(redis_client, prefix) == before

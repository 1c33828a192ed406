"""Edit and replay: a failed or archived task's arguments edited (checked against its handler)
and run again, who edited what kept in its history; every archived task of a type and an error
class run again as a bulk job. On one Redis and on the 3-master Cluster, through the operations
layer, the admin, the API and `rtq_run`."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import PermissionDenied
from rest_framework.test import APIClient

from django_rtq import permissions as perms
from django_rtq.broker import Broker, TaskState, bulk, manual
from django_rtq.broker.inspect import Inspector
from django_rtq.broker.states import Action
from django_rtq.exceptions import InvalidArguments, InvalidStateTransition
from django_rtq.message_builder import build_message
from django_rtq.models import TaskEdit
from django_rtq.operations import Operations
from django_rtq.worker.server import Worker
from tests.support.admin_pages import ACTION_URL, confirm, messages_of, task_url, text
from tests.support.commands import run as run_command
from tests.support.factories import claim_ids, failed_call
from tests.support.polling import wait_for
from tests.support.users import logged_in, user_with
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

S = TaskState
Q = "default"  # tasks.divide's queue
ZERO = "builtins.ZeroDivisionError"
API = "/rtq/api/"


@pytest.fixture(params=["standalone", "cluster"])
def any_redis(request: pytest.FixtureRequest) -> Broker:
    """A broker on the standalone Redis, then on the 3-master Cluster (real clocks: workers run)."""
    return request.getfixturevalue("broker" if request.param == "standalone" else "cluster_broker")


def editor(username: str = "editor"):
    return user_with(perms.VIEW_LIVE, perms.CHANGE_LIVE, perms.EDIT_ARGUMENTS, username=username)


def stored(broker: Broker, task_id: str) -> dict:
    return json.loads(broker.client.hget(broker.queue(Q).msg, task_id))


# The operations layer, on both Redis setups


def test_an_archived_task_runs_again_with_its_edited_arguments(any_redis: Broker):
    worker = Worker(broker=any_redis, queues={Q: 1}, concurrency=2, relay=False)
    worker.start()
    try:
        message = build_message(tasks.divide, [1, 0], {})
        any_redis.enqueue([message])
        inspector = Inspector(any_redis)
        archived = wait_for(lambda: (t := inspector.get_task(message.id)).state == S.ARCHIVED and t)
        assert archived.attempt.error_type == ZERO

        ops = Operations(editor(), broker=any_redis)
        edit = ops.edit_and_run(message.id, [9, 4], {"digits": 1})

        done = wait_for(lambda: (t := inspector.get_task(message.id)).state == S.COMPLETED and t)
    finally:
        worker.stop()
    assert done.result == 2.2  # 9 / 4, rounded as the new keyword asked
    assert (done.message.args, done.message.kwargs) == ([9, 4], {"digits": 1})
    assert (edit.edited_by, edit.state, edit.queue, edit.task_name) == (
        "editor",
        S.ARCHIVED,
        Q,
        tasks.divide.name,
    )
    assert (edit.old_args, edit.old_kwargs, edit.new_args, edit.new_kwargs) == (
        [1, 0],
        {},
        [9, 4],
        {"digits": 1},
    )
    assert list(ops.task_edits(message.id)) == [edit]


def test_a_retry_task_is_edited_and_pending_at_once(any_redis: Broker):
    task_id = failed_call(any_redis, tasks.divide, [1, 0], to=S.RETRY)
    Operations(editor(), broker=any_redis).edit_and_run(task_id, [6, 3], {})
    task = Inspector(any_redis).get_task(task_id)
    assert task.state == S.PENDING
    assert task.message.args == [6, 3]
    assert task.attempt.error_type == ZERO  # its attempts so far are kept
    assert any_redis.client.zscore(any_redis.queue(Q).retry, task_id) is None


@pytest.mark.parametrize(
    ("args", "kwargs", "said"),
    [
        ([1], {}, "missing a required argument: 'b'"),
        ([1, 2, 3], {}, "too many positional arguments"),
        ([1, 2], {"round": 2}, "unexpected keyword argument 'round'"),
        ([1, {1, 2}], {}, "must be JSON-serializable"),
        ([1, (2, 3)], {}, "a tuple decodes as a list"),
    ],
)
def test_arguments_the_handler_would_refuse_change_nothing(any_redis: Broker, args, kwargs, said):
    task_id = failed_call(any_redis, tasks.divide, [1, 0])
    before = any_redis.client.hget(any_redis.queue(Q).msg, task_id)
    with pytest.raises(InvalidArguments, match=said):
        Operations(editor(), broker=any_redis).edit_and_run(task_id, args, kwargs)
    assert Inspector(any_redis).get_task(task_id).state == S.ARCHIVED
    assert any_redis.client.hget(any_redis.queue(Q).msg, task_id) == before
    assert not TaskEdit.objects.exists()


@pytest.mark.parametrize("state", [S.PENDING, S.SCHEDULED, S.COMPLETED])
def test_only_retry_and_archived_tasks_are_edited(broker: Broker, state: TaskState):
    message = build_message(tasks.divide.using(delay=60 if state == S.SCHEDULED else None), [1, 0], {})
    broker.enqueue([message])
    if state == S.COMPLETED:
        claim_ids(broker, Q)
        broker.complete(Q, [_done(message.id)], worker_id="worker-1")
    with pytest.raises(InvalidStateTransition, match=f"is {state}: only retry or archived"):
        Operations(editor(), broker=broker).edit_and_run(message.id, [4, 2], {})
    assert stored(broker, message.id)["args"] == [1, 0]
    assert not TaskEdit.objects.exists()


def _done(task_id: str):
    from tests.support.factories import done

    return done(task_id, retention=60)


def test_an_edit_made_from_a_stale_read_changes_nothing(any_redis: Broker):
    """The script replaces the message only if it is still the one read: of two people editing
    at once, the second is refused, and nothing of theirs is recorded."""
    task_id = failed_call(any_redis, tasks.divide, [1, 0])
    inspector = Inspector(any_redis)
    stale = inspector.get_task(task_id)
    mine = Operations(editor(), broker=any_redis).check_edit(stale, [8, 2], {})
    any_redis.client.hset(any_redis.queue(Q).msg, task_id, build_message(tasks.divide, [5, 5], {}).to_json())
    assert manual.edit_and_run(any_redis, Q, task_id, stale.raw_message, mine) is False
    assert inspector.get_task(task_id).state == S.ARCHIVED
    assert stored(any_redis, task_id)["args"] == [5, 5]


def test_a_task_that_moved_meanwhile_is_not_edited_nor_recorded(broker: Broker, monkeypatch):
    task_id = failed_call(broker, tasks.divide, [1, 0])
    ops = Operations(editor(), broker=broker)
    real_check = ops.check_edit

    def another_hand_runs_it_first(task, args, kwargs):
        assert manual.run_now(broker, Q, [task.id]) == 1
        return real_check(task, args, kwargs)

    monkeypatch.setattr(ops, "check_edit", another_hand_runs_it_first)
    with pytest.raises(InvalidStateTransition, match="moved, or someone edited it, meanwhile"):
        ops.edit_and_run(task_id, [4, 2], {})
    assert stored(broker, task_id)["args"] == [1, 0]
    assert not TaskEdit.objects.exists()  # the record rolled back with the refused edit


def test_editing_needs_its_own_permission(broker: Broker):
    task_id = failed_call(broker, tasks.divide, [1, 0])
    changer = user_with(perms.VIEW_LIVE, perms.CHANGE_LIVE, username="changer")
    with pytest.raises(PermissionDenied, match="edit_task_arguments"):
        Operations(changer).edit_and_run(task_id, [4, 2], {})
    with pytest.raises(PermissionDenied):
        Operations(changer).editable_task(task_id)

    admin_page = logged_in(changer).get(f"/admin/django_rtq/livetask/task/{task_id}/edit/?queue={Q}")
    assert admin_page.status_code == 403
    assert "Edit arguments" not in text(logged_in(changer).get(task_url(task_id, Q)))
    api = APIClient()
    api.force_authenticate(changer)
    assert api.post(f"{API}tasks/{task_id}/edit/", {"args": [4, 2]}, format="json").status_code == 403

    assert stored(broker, task_id)["args"] == [1, 0]
    assert not TaskEdit.objects.exists()


# Run again every archived task of a type and an error class: a bulk job


def archive_of_mixed_failures(broker: Broker) -> dict[str, list[str]]:
    return {
        "divide-zero": [failed_call(broker, tasks.divide, [n, 0]) for n in range(3)],
        "divide-key": [failed_call(broker, tasks.divide, [1, 0], error_type="builtins.KeyError")],
        "add-zero": [failed_call(broker, tasks.add, [1, 2])],
    }


def test_run_again_every_archived_task_of_a_type_and_an_error(any_redis: Broker, monkeypatch):
    monkeypatch.setattr(bulk, "PAGE", 2)  # pages that start on tasks it steps over
    archive = archive_of_mixed_failures(any_redis)
    ops = Operations(editor(), broker=any_redis)
    narrowing = {"task_name": tasks.divide.name, "error_class": ZERO}
    assert ops.count_matching(Q, S.ARCHIVED, **narrowing) == 3
    assert ops.count_matching(Q, S.ARCHIVED, error_class=ZERO) == 4
    assert ops.count_matching(Q, S.ARCHIVED) == 5

    job = ops.start_bulk(Action.RUN, Q, [S.ARCHIVED], budget=30, **narrowing)

    assert job.finished
    assert (job.done, job.skipped, job.started_by) == (3, 2, "editor")
    inspector = Inspector(any_redis)
    assert sorted(t.id for t in inspector.list_tasks(Q, S.PENDING, limit=10)) == sorted(
        archive["divide-zero"]
    )
    assert sorted(t.id for t in inspector.list_tasks(Q, S.ARCHIVED, limit=10)) == sorted(
        archive["divide-key"] + archive["add-zero"]
    )


def test_the_script_checks_the_narrowing_again(any_redis: Broker):
    """Ids handed to the script that do not match (their type or error changed meanwhile, say)
    stay where they are."""
    archive = archive_of_mixed_failures(any_redis)
    every = [task_id for ids in archive.values() for task_id in ids]
    moved = manual.run_now(any_redis, Q, every, only_task=tasks.divide.name, only_error="builtins.KeyError")
    assert moved == 1
    assert Inspector(any_redis).get_task(archive["divide-key"][0]).state == S.PENDING


def test_a_narrowed_job_is_stored_so_that_no_older_release_runs_it_wider(broker: Broker):
    plain = bulk.start(broker, Q, Action.RUN, [S.ARCHIVED])
    narrowed = bulk.start(broker, Q, Action.RUN, [S.ARCHIVED], task_name=tasks.divide.name)
    assert "task_name" not in json.loads(plain.to_json())  # as releases before it wrote (and read) it
    assert json.loads(narrowed.to_json())["task_name"] == tasks.divide.name
    assert bulk.get(broker, Q, narrowed.id).task_name == tasks.divide.name
    with pytest.raises(InvalidStateTransition, match="Only a run can be narrowed"):
        bulk.start(broker, Q, Action.DELETE, [S.ARCHIVED], error_class=ZERO)


def test_rtq_run_runs_again_the_archived_tasks_of_a_type_and_an_error(broker: Broker):
    archive = archive_of_mixed_failures(broker)
    out = run_command(
        "rtq_run",
        "--queue",
        Q,
        "--all",
        "archived",
        "--task",
        tasks.divide.name,
        "--error-class",
        ZERO,
        "--json",
    )
    report = json.loads(out)
    assert (report["count"], report["skipped"], report["task_name"], report["error_class"]) == (
        3,
        2,
        tasks.divide.name,
        ZERO,
    )
    assert Inspector(broker).count(Q, S.ARCHIVED) == len(archive["divide-key"] + archive["add-zero"])


# The admin


def test_the_admin_edits_a_task_checks_its_arguments_and_asks_first(broker: Broker):
    task_id = failed_call(broker, tasks.divide, [1, 0])
    client = logged_in(editor())
    page = client.get(task_url(task_id, Q))
    assert "Edit arguments and run again" in text(page)
    edit_url = f"/admin/django_rtq/livetask/task/{task_id}/edit/"

    form = client.get(edit_url, {"queue": Q})
    assert form.status_code == 200
    assert "divide(a, b, *, digits=None)" in text(form)
    assert "[\n  1,\n  0\n]" in text(form)

    not_json = client.post(edit_url, {"queue": Q, "args": "[1, 2", "kwargs": "{}"})
    assert not_json.status_code == 400
    assert "Not valid JSON" in text(not_json)
    not_a_list = client.post(edit_url, {"queue": Q, "args": '{"a": 1}', "kwargs": "{}"})
    assert "Expected a JSON list, not dict." in text(not_a_list)
    unbound = client.post(edit_url, {"queue": Q, "args": "[1]", "kwargs": '{"digits": 2}'})
    assert unbound.status_code == 400
    assert "missing a required argument: 'b'" in text(unbound)
    assert '{"digits": 2}' in text(unbound)  # what was typed is kept

    data = {"queue": Q, "args": "[10, 4]", "kwargs": '{"digits": 0}'}
    done = confirm(client, edit_url, data)
    assert done.status_code == 302
    assert messages_of(done) == [f"Task {task_id!r} of queue {Q!r} edited and moved to pending."]
    assert Inspector(broker).get_task(task_id).state == S.PENDING
    assert stored(broker, task_id)["args"] == [10, 4]

    history = text(client.get(task_url(task_id, Q)))
    assert 'id="rtq-history"' in history
    assert "editor" in history
    [edit] = TaskEdit.objects.all()
    assert (edit.old_args, edit.new_args, edit.new_kwargs) == ([1, 0], [10, 4], {"digits": 0})


def test_the_confirmation_shows_the_arguments_before_and_after(broker: Broker):
    task_id = failed_call(broker, tasks.divide, [1, 0])
    asked = logged_in(editor()).post(
        f"/admin/django_rtq/livetask/task/{task_id}/edit/", {"queue": Q, "args": "[7, 7]", "kwargs": ""}
    )
    page = text(asked)
    assert "Are you sure?" in page
    assert 'id="rtq-confirm-changes"' in page
    assert "Yes, edit and run again" in page
    assert stored(broker, task_id)["args"] == [1, 0]  # nothing yet


def test_the_admin_runs_again_the_archived_tasks_like_one(broker: Broker):
    archive = archive_of_mixed_failures(broker)
    client = logged_in(editor())
    page = text(client.get(task_url(archive["divide-zero"][0], Q)))
    assert "Run again all archived like this" in page

    data = {
        "action": "run",
        "queue": Q,
        "state": "archived",
        "scope": "all",
        "task_name": tasks.divide.name,
        "error_class": ZERO,
    }
    asked = client.post(ACTION_URL, data)
    assert (
        f"Run now: all 3 archived tasks of type {tasks.divide.name} whose last error is a {ZERO} "
        f"of queue {Q!r}?"
    ) in text(asked)
    done = client.post(ACTION_URL, {**data, "confirm": "yes"})
    assert done.status_code == 302
    progress = text(client.get(done["Location"]))
    assert f"of type {tasks.divide.name} whose last error is a {ZERO}" in progress
    assert Inspector(broker).count(Q, S.PENDING) == 3
    assert Inspector(broker).count(Q, S.ARCHIVED) == 2


def test_the_admin_narrows_nothing_but_a_run_of_a_whole_state(broker: Broker):
    archive = archive_of_mixed_failures(broker)
    data = {"action": "delete", "queue": Q, "state": "archived", "scope": "all", "error_class": ZERO}
    refused = logged_in(editor()).post(ACTION_URL, {**data, "confirm": "yes"})
    assert messages_of(refused) == ["Only a run of a whole state can be narrowed to a task type or an error."]
    assert Inspector(broker).count(Q, S.ARCHIVED) == sum(map(len, archive.values()))


# The API


def test_the_api_edits_a_task_and_lists_its_edits(broker: Broker):
    task_id = failed_call(broker, tasks.divide, [1, 0], to=S.RETRY)
    api = APIClient()
    api.force_authenticate(editor("api-editor"))

    refused = api.post(f"{API}tasks/{task_id}/edit/", {"args": [1]}, format="json")
    assert refused.status_code == 400
    assert refused.json() == {"kwargs": {"b": ["missing required argument"]}}
    nothing = api.post(f"{API}tasks/{task_id}/edit/", {}, format="json")
    assert nothing.status_code == 400

    edited = api.post(f"{API}tasks/{task_id}/edit/", {"kwargs": {"digits": 3}}, format="json")
    assert edited.status_code == 200, edited.json()
    body = edited.json()
    assert (body["edited_by"], body["state"], body["new_args"], body["new_kwargs"]) == (
        "api-editor",
        "retry",
        [1, 0],  # left out: kept
        {"digits": 3},
    )
    again = api.post(f"{API}tasks/{task_id}/edit/", {"args": [2, 1]}, format="json")
    assert again.status_code == 409  # pending now

    edits = api.get(f"{API}tasks/{task_id}/edits/")
    assert [edit["new_kwargs"] for edit in edits.json()] == [{"digits": 3}]


def test_the_api_runs_again_a_narrowed_state(broker: Broker):
    archive_of_mixed_failures(broker)
    api = APIClient()
    api.force_authenticate(editor())
    started = api.post(
        f"{API}queues/{Q}/bulk/",
        {"action": "run", "state": "archived", "task_name": tasks.divide.name, "error_class": ZERO},
        format="json",
    )
    assert started.status_code == 202
    body = started.json()
    assert (body["task_name"], body["error_class"]) == (tasks.divide.name, ZERO)
    assert Inspector(broker).count(Q, S.PENDING) == 3

    wider = api.post(
        f"{API}queues/{Q}/bulk/",
        {"action": "delete", "state": "archived", "error_class": ZERO},
        format="json",
    )
    assert wider.status_code == 400
    assert "error_class" in wider.json()

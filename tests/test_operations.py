"""The operations layer on a real Redis: permissions, where a task is found, and what actions report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from django_rtq import permissions as perms
from django_rtq.broker import TaskState
from django_rtq.broker.inspect import TaskInfo
from django_rtq.broker.states import ACTION_STATES, Action, skip_reason
from django_rtq.exceptions import BulkJobNotFound, InvalidStateTransition, QueueNotFound, TaskNotFound
from django_rtq.models import FinishedTask
from django_rtq.operations import WORKFLOW_RUN_REASON, Operations
from django_rtq.task_view import TaskView
from tests.support.factories import BILLING, EMAILS, WORKER, claim_ids, done, enqueue, failed_call, make_tasks
from tests.support.users import user_with
from tests.testapp import api_tasks, tasks

pytestmark = pytest.mark.django_db

S = TaskState
VIEW, CHANGE, ENQUEUE, HISTORY = perms.VIEW_LIVE, perms.CHANGE_LIVE, perms.ENQUEUE, perms.VIEW_HISTORY
EDIT = perms.EDIT_ARGUMENTS
ZERO = "builtins.ZeroDivisionError"


# Permissions: each operation needs one permission (or one of several), and nothing else opens it.

OPERATIONS: dict[str, tuple[tuple[str, ...], Callable[[Operations, dict[str, Any]], Any]]] = {
    "queues": ((VIEW,), lambda ops, w: ops.queues()),
    "queue_stats": ((VIEW,), lambda ops, w: ops.queue_stats(EMAILS)),
    "history": ((VIEW,), lambda ops, w: ops.history(EMAILS, 3)),
    "workers": ((VIEW,), lambda ops, w: ops.workers()),
    "count": ((VIEW,), lambda ops, w: ops.count(EMAILS, S.PENDING)),
    "list_tasks": ((VIEW,), lambda ops, w: ops.list_tasks(EMAILS, S.PENDING)),
    "search_by_name": ((VIEW,), lambda ops, w: ops.search_by_name(EMAILS, S.PENDING, "noop")),
    "live_task": ((VIEW,), lambda ops, w: ops.live_task(w["pending"])),
    "bulk_jobs": ((VIEW,), lambda ops, w: ops.bulk_jobs()),
    "finished_tasks": ((HISTORY,), lambda ops, w: list(ops.finished_tasks())),
    "exposed_task_types": ((VIEW, ENQUEUE), lambda ops, w: ops.exposed_task_types()),
    "pause": ((CHANGE,), lambda ops, w: ops.pause(EMAILS)),
    "act": ((CHANGE,), lambda ops, w: ops.act(Action.ARCHIVE, [w["pending"]])),
    "start_bulk": ((CHANGE,), lambda ops, w: ops.start_bulk(Action.ARCHIVE, EMAILS, [S.PENDING])),
    "purge": ((CHANGE,), lambda ops, w: ops.purge(EMAILS)),
    "count_matching": ((VIEW,), lambda ops, w: ops.count_matching(EMAILS, S.ARCHIVED, error_class=ZERO)),
    "edit_and_run": ((EDIT,), lambda ops, w: ops.edit_and_run(w["archived"], [4, 2], {})),
    "task_edits": ((VIEW, HISTORY), lambda ops, w: list(ops.task_edits(w["archived"]))),
    "enqueue": (
        (ENQUEUE,),
        lambda ops, w: ops.enqueue(ops.exposed_task_type(api_tasks.greet.name), ["Ada"], {}),
    ),
}


@pytest.fixture
def world(broker) -> dict[str, Any]:
    archived = failed_call(broker, tasks.divide.using(queue=EMAILS), [1, 0], error_type=ZERO)  # first
    return {"pending": make_tasks(broker, S.PENDING)[0], "archived": archived}


@pytest.mark.parametrize("name", OPERATIONS)
@pytest.mark.parametrize("granted", [(), (VIEW,), (CHANGE,), (ENQUEUE,), (HISTORY,), (EDIT,)], ids=str)
def test_each_operation_needs_its_permission(name, granted, world, broker):
    needs, call = OPERATIONS[name]
    ops = Operations(user_with(*granted, is_staff=True))
    # change_livetask includes view_livetask, as in Django's admin.
    held = set(granted) | ({VIEW} if CHANGE in granted else set())
    if held & set(needs):
        call(ops, world)
    else:
        with pytest.raises(PermissionDenied, match=" or ".join(needs)):
            call(ops, world)
        assert broker.client.hget(broker.queue(EMAILS).state, world["pending"]) == S.PENDING
        assert broker.client.hget(broker.queue(EMAILS).state, world["archived"]) == S.ARCHIVED
        assert not broker.is_paused(EMAILS)


@pytest.mark.parametrize("name", OPERATIONS)
def test_anonymous_and_inactive_users_may_do_nothing_and_superusers_everything(name, world):
    _, call = OPERATIONS[name]
    inactive = User.objects.create_superuser("gone", "gone@example.com", None, is_active=False)
    for user in (AnonymousUser(), inactive):
        with pytest.raises(PermissionDenied):
            call(Operations(user), world)
    call(Operations(User.objects.create_superuser("root", "root@example.com", None)), world)


#: What each operation gives trusted code, on a fresh `world` (its result, the world, the broker).
TRUSTED_RESULTS: dict[str, Callable[[Any, dict[str, Any], Any], bool]] = {
    "queues": lambda r, w, b: EMAILS in r,
    "queue_stats": lambda r, w, b: (r.queue, r.pending) == (EMAILS, 1),
    "history": lambda r, w, b: len(r) == 3,
    "workers": lambda r, w, b: r == [],
    "count": lambda r, w, b: r == 1,
    "list_tasks": lambda r, w, b: [task.id for task in r] == [w["pending"]],
    "search_by_name": lambda r, w, b: [task.id for task in r] == [w["pending"]],
    "live_task": lambda r, w, b: (r.id, r.state) == (w["pending"], S.PENDING),
    "bulk_jobs": lambda r, w, b: r == [],
    "finished_tasks": lambda r, w, b: r == [],
    "exposed_task_types": lambda r, w, b: api_tasks.greet.name in {t.name for t in r},
    "pause": lambda r, w, b: b.is_paused(EMAILS),
    "act": lambda r, w, b: r.count == 1 and b.client.hget(b.queue(EMAILS).state, w["pending"]) == S.ARCHIVED,
    "start_bulk": lambda r, w, b: (r.queue, r.action, r.counts) == (EMAILS, Action.ARCHIVE, [1]),
    "purge": lambda r, w, b: (r.queue, r.action) == (EMAILS, Action.DELETE),
    "enqueue": lambda r, w, b: b.client.hexists(b.queue(r.queue).msg, r.id),
    "count_matching": lambda r, w, b: r == 1,
    "edit_and_run": lambda r, w, b: (
        (r.new_args, r.edited_by) == ([4, 2], "")
        and b.client.hget(b.queue(EMAILS).state, w["archived"]) == S.PENDING
    ),
    "task_edits": lambda r, w, b: r == [],
}


@pytest.mark.parametrize("name", OPERATIONS)
def test_trusted_code_needs_no_user(name, world, broker):
    _, call = OPERATIONS[name]
    assert TRUSTED_RESULTS[name](call(Operations(), world), world, broker)


# Acting on tasks by id


def test_an_action_reports_what_it_did_skipped_and_could_not_find(broker):
    completed = make_tasks(broker, S.COMPLETED)  # first: making it claims a pending task
    pending = make_tasks(broker, S.PENDING, count=2)
    report = Operations().act(Action.ARCHIVE, [*pending, *completed, "nope", pending[0]])
    assert report.count == 2 and [ref.id for ref in report.acted] == pending
    [(ref, reason)] = report.skipped
    assert (ref.id, ref.queue, ref.state) == (completed[0], EMAILS, S.COMPLETED)
    assert (
        reason
        == skip_reason(Action.ARCHIVE, S.COMPLETED)
        == ("it is completed; archive applies to pending, scheduled, retry tasks")
    )
    assert report.missing == ["nope"] and report.changed_meanwhile == 0
    assert {broker.client.hget(broker.queue(EMAILS).state, i) for i in pending} == {S.ARCHIVED}


def test_an_action_finds_each_task_in_its_own_queue_or_only_in_the_one_given(broker):
    emails, billing = make_tasks(broker, S.SCHEDULED, EMAILS)[0], make_tasks(broker, S.SCHEDULED, BILLING)[0]
    report = Operations().act(Action.RUN, [emails, billing], queue=BILLING)
    assert [ref.id for ref in report.acted] == [billing] and report.missing == [emails]
    report = Operations().act(Action.RUN, [emails])
    assert report.count == 1 and report.acted[0].queue == EMAILS


def test_every_state_is_offered_exactly_the_actions_of_the_table(broker):
    for action, queue in ((Action.RUN, EMAILS), (Action.ARCHIVE, BILLING)):
        states = (S.SCHEDULED, S.RETRY, S.ARCHIVED, S.COMPLETED)
        tasks = {state: make_tasks(broker, state, queue)[0] for state in states}
        report = Operations().act(action, list(tasks.values()))
        assert {ref.state for ref in report.acted} == set(ACTION_STATES[action]) & set(tasks)
        assert {ref.state for ref, _ in report.skipped} == set(tasks) - set(ACTION_STATES[action])
        assert report.count == len(report.acted)


def test_running_a_workflow_is_skipped_with_the_reason(broker):
    [workflow_id] = make_tasks(broker, S.WAITING)
    broker.client.hset(broker.queue(EMAILS).state, workflow_id, S.ARCHIVED)  # as if it had failed
    broker.client.zadd(broker.queue(EMAILS).archived, {workflow_id: broker.now_ms()})
    report = Operations().act(Action.RUN, [workflow_id])
    assert report.count == 0 and report.acted == []
    assert [reason for _, reason in report.skipped] == [WORKFLOW_RUN_REASON]
    with pytest.raises(InvalidStateTransition, match="a finished workflow cannot be run again"):
        Operations().act_on_one(Action.RUN, workflow_id)


def test_acting_on_one_task_says_why_it_did_not(broker):
    [completed] = make_tasks(broker, S.COMPLETED)
    with pytest.raises(TaskNotFound, match="'nope' in queue 'emails'"):
        Operations().act_on_one(Action.DELETE, "nope", EMAILS)
    with pytest.raises(InvalidStateTransition, match="was not archived: it is completed"):
        Operations().act_on_one(Action.ARCHIVE, completed)
    [active] = make_tasks(broker, S.ACTIVE)
    with pytest.raises(InvalidStateTransition, match="No worker is listening"):
        Operations().act_on_one(Action.CANCEL, active)
    assert Operations().act_on_one(Action.DELETE, completed).count == 1
    with pytest.raises(TaskNotFound):
        Operations().live_task(completed)


def test_cancelling_a_waiting_workflow_archives_it_at_once(broker):
    [workflow_id] = make_tasks(broker, S.WAITING)
    report = Operations().act(Action.CANCEL, [workflow_id])
    assert report.count == 1
    assert Operations().live_task(workflow_id).state == S.ARCHIVED


# Finding a task: live, then the mirror's buffer, then the ORM


def finish(broker, queue: str = EMAILS) -> str:
    [task_id] = enqueue(broker, queue)
    assert claim_ids(broker, queue) == [task_id]
    broker.complete(queue, [done(task_id, result=42)], worker_id=WORKER)  # no retention: gone at once
    return task_id


def test_a_task_is_found_live_then_in_the_buffer_then_in_the_orm(mirroring, broker):
    [live] = make_tasks(broker, S.RETRY)
    found = Operations().find_task(live)
    assert isinstance(found, TaskInfo) and found.state == S.RETRY

    buffered = finish(broker)
    row = Operations().find_task(buffered)
    assert isinstance(row, FinishedTask) and row._state.adding  # built from the buffer, not saved
    assert (row.task_id, row.queue, row.succeeded, row.return_value) == (buffered, EMAILS, True, 42)

    FinishedTask.objects.create(
        task_id="old",
        queue=BILLING,
        task_name="t",
        status=FinishedTask.Status.SUCCEEDED,
        finished_at=timezone.now(),
    )
    row = Operations().find_task("old")
    assert not row._state.adding and row.queue == BILLING
    with pytest.raises(TaskNotFound, match="'old' in queue 'emails'"):
        Operations().find_task("old", EMAILS)
    with pytest.raises(TaskNotFound, match=r"No task with id 'nope'\."):
        Operations().find_task("nope")


def test_get_task_gives_one_view_of_a_live_task_and_of_a_finished_one(mirroring, broker):
    ops = Operations()
    [live] = make_tasks(broker, S.RETRY)
    finished = finish(broker)
    FinishedTask.objects.create(
        task_id="old",
        queue=BILLING,
        task_name="t",
        status=FinishedTask.Status.FAILED,
        error_message="boom",
        finished_at=timezone.now(),
    )

    views = {task_id: ops.get_task(task_id) for task_id in (live, finished, "old")}
    assert all(isinstance(view, TaskView) for view in views.values())
    # The same names whether the task is live or finished (not .status nor .return_value).
    assert [(v.id, v.state, v.live) for v in views.values()] == [
        (live, S.RETRY, True),
        (finished, S.COMPLETED, False),
        ("old", S.ARCHIVED, False),
    ]
    assert (views[finished].result, views["old"].error) == (42, "boom")
    with pytest.raises(TaskNotFound, match=r"No task with id 'nope'\."):
        ops.get_task("nope")
    with pytest.raises(PermissionDenied, match=HISTORY):
        Operations(user_with(VIEW)).get_task(finished)  # as find_task: history needs its permission


def test_a_finished_task_needs_the_history_permission_and_a_live_one_the_live_one(mirroring, broker):
    buffered = finish(broker)
    [live] = make_tasks(broker, S.PENDING)
    viewer, historian = Operations(user_with(VIEW)), Operations(user_with(HISTORY))
    assert viewer.find_task(live).id == live
    with pytest.raises(PermissionDenied, match=HISTORY):
        viewer.find_task(buffered)
    with pytest.raises(TaskNotFound):
        viewer.find_task("nope")  # not found, not forbidden: nothing is there to hide
    assert historian.find_task(buffered).task_id == buffered
    with pytest.raises(TaskNotFound):
        historian.find_task(live)  # live tasks are not history
    with pytest.raises(PermissionDenied):
        Operations(user_with(ENQUEUE)).find_task(live)


# Queues and bulk jobs


def test_queues_are_the_known_and_the_configured_ones_and_others_are_refused(broker):
    enqueue(broker, BILLING)
    assert Operations().queues() == sorted({"default", "low", BILLING})
    with pytest.raises(QueueNotFound, match=r"Unknown queue 'nope'\. Known queues: billing, default, low\."):
        Operations().start_bulk(Action.DELETE, "nope", [S.PENDING])


def test_pause_and_resume_say_whether_they_changed_anything(broker):
    ops = Operations()
    assert ops.pause("low") and not ops.pause("low") and ops.is_paused("low")
    assert ops.resume("low") and not ops.resume("low") and not ops.is_paused("low")


def test_a_bulk_job_records_who_started_it_and_is_found_again(broker):
    make_tasks(broker, S.PENDING, count=3)
    user = user_with(CHANGE)
    job = Operations(user).start_bulk(Action.ARCHIVE, EMAILS, [S.PENDING])
    assert job.finished and job.done == 3 and job.started_by == user.get_username()
    assert Operations().bulk_job(EMAILS, job.id).done == 3
    assert [j.id for j in Operations().bulk_jobs()] == [job.id]
    with pytest.raises(BulkJobNotFound):
        Operations().bulk_job(EMAILS, "nope")
    with pytest.raises(
        InvalidStateTransition, match="archive applies to pending, scheduled, retry tasks, not completed"
    ):
        Operations().start_bulk(Action.ARCHIVE, EMAILS, [S.COMPLETED])
    with pytest.raises(InvalidStateTransition, match="one by one"):
        Operations().start_bulk(Action.CANCEL, EMAILS, [S.ACTIVE])


def test_purge_deletes_every_task_but_the_active_ones(broker):
    states = (S.ACTIVE, S.COMPLETED, S.ARCHIVED, S.RETRY, S.SCHEDULED, S.WAITING, S.PENDING)
    made = {state: make_tasks(broker, state, count=2) for state in states}
    job = Operations().purge(EMAILS)
    assert job.finished and job.done == 12
    assert {state: Operations().count(EMAILS, state) for state in states} == {
        state: 2 if state == S.ACTIVE else 0 for state in states
    }
    assert {t.id for t in Operations().list_tasks(EMAILS, S.ACTIVE)} == set(made[S.ACTIVE])

"""The admin: live views over Redis (dashboard, lists, task page, actions, bulk progress), permissions,
the mirror."""

from __future__ import annotations

import html
import json
import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_rtq.admin_views.charts import history_chart, nice_ceiling
from django_rtq.admin_views.tasks import PER_PAGE
from django_rtq.broker import TaskMessage, TaskState, manual
from django_rtq.broker.bulk import PURGE_STATES
from django_rtq.broker.inspect import NAME_SEARCH_SCAN
from django_rtq.broker.states import Action
from django_rtq.models import FinishedTask
from django_rtq.operations import Operations
from tests.support.admin_pages import (
    ACTION_URL,
    DASHBOARD,
    Q,
    confirm,
    messages_of,
    row_ids,
    task_url,
    tasks_url,
    text,
)
from tests.support.factories import enqueue, make_tasks
from tests.support.polling import wait_for
from tests.support.reading import ids_in
from tests.support.users import logged_in, user_with
from tests.testapp import tasks as testapp_tasks

pytestmark = pytest.mark.django_db

S = TaskState


QUEUE_ACTION_URL = "/admin/django_rtq/livetask/actions/queue/"


def bulk_url(queue: str, job_id: str) -> str:
    return reverse("admin:django_rtq_bulk", args=[queue, job_id])


def carry_on_url(queue: str, job_id: str) -> str:
    return reverse("admin:django_rtq_bulk_carry_on", args=[queue, job_id])


@pytest.fixture
def operator_client(broker) -> Client:
    return logged_in(user_with("view_livetask", "change_livetask", username="operator"))


def enqueue_named(broker, name: str, count: int) -> list[str]:
    messages = [
        TaskMessage(id=uuid.uuid4().hex, task=name, queue=Q, enqueued_at=broker.clock()) for _ in range(count)
    ]
    broker.enqueue(messages)
    return [message.id for message in messages]


# Permissions


def test_anonymous_users_are_sent_to_the_login_page(broker, client):
    for url in (DASHBOARD, tasks_url("archived"), task_url("x"), ACTION_URL):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")


def test_staff_without_the_permissions_see_nothing_of_the_live_views(broker):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)
    client = logged_in(user_with("view_finishedtask"))

    for url in (DASHBOARD, tasks_url("archived", queue=Q), task_url(task_id)):
        assert client.get(url).status_code == 403
    data = {"action": "run", "queue": Q, "state": "archived", "ids": task_id, "confirm": "yes"}
    assert client.post(ACTION_URL, data).status_code == 403
    assert client.post(QUEUE_ACTION_URL, {"queue": Q, "action": "pause", "confirm": "yes"}).status_code == 403
    index = client.get("/admin/")
    assert "Finished tasks" in index.text
    assert "Live tasks" not in index.text
    assert ids_in(broker, Q, S.ARCHIVED) == [task_id]
    assert not broker.is_paused(Q)


def test_staff_without_any_permission_of_the_app_do_not_see_it_in_the_index(broker):
    client = logged_in(user_with())
    index = client.get("/admin/")
    assert index.status_code == 200
    assert "django_rtq" not in index.text
    assert client.get("/admin/django_rtq/").status_code == 404  # the app index hides unreadable apps


def test_the_view_permission_shows_the_pages_without_actions(broker, viewer_client):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)

    index = viewer_client.get("/admin/")
    assert "Live tasks" in index.text
    dashboard = viewer_client.get(DASHBOARD)
    assert dashboard.status_code == 200
    assert 'name="action" value="pause"' not in dashboard.text
    assert 'value="purge"' not in dashboard.text
    listing = viewer_client.get(tasks_url("archived", queue=Q))
    assert row_ids(listing) == [task_id]
    assert 'name="ids"' not in listing.text
    page = viewer_client.get(task_url(task_id))
    assert page.status_code == 200
    assert "rtq-task-actions" not in page.text

    data = {"action": "run", "queue": Q, "state": "archived", "ids": task_id}
    assert viewer_client.post(ACTION_URL, data).status_code == 403
    assert viewer_client.post(ACTION_URL, {**data, "confirm": "yes"}).status_code == 403
    assert viewer_client.post(QUEUE_ACTION_URL, {"queue": Q, "action": "pause"}).status_code == 403
    assert ids_in(broker, Q, S.ARCHIVED) == [task_id]


def test_the_change_permission_allows_acting(broker, operator_client):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)

    listing = operator_client.get(tasks_url("archived", queue=Q))
    assert 'name="ids"' in listing.text
    response = confirm(
        operator_client, ACTION_URL, {"action": "run", "queue": Q, "state": "archived", "ids": task_id}
    )

    assert response.status_code == 302
    assert ids_in(broker, Q, S.PENDING) == [task_id]


def test_actions_are_post_only(broker, superuser_client):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)
    query = f"?action=run&queue={Q}&state=archived&ids={task_id}&confirm=yes"
    assert superuser_client.get(ACTION_URL + query).status_code == 405
    assert superuser_client.get(QUEUE_ACTION_URL + f"?queue={Q}&action=pause&confirm=yes").status_code == 405
    assert ids_in(broker, Q, S.ARCHIVED) == [task_id]


def test_actions_need_the_csrf_token(broker):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client = logged_in(user, enforce_csrf_checks=True)
    data = {"action": "run", "queue": Q, "state": "archived", "ids": task_id, "confirm": "yes"}

    assert client.post(ACTION_URL, data).status_code == 403
    assert ids_in(broker, Q, S.ARCHIVED) == [task_id]

    page = client.get(task_url(task_id))  # sets the CSRF cookie; its forms carry the token
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    response = client.post(ACTION_URL, {**data, "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert ids_in(broker, Q, S.PENDING) == [task_id]


# Dashboard


def test_the_dashboard_shows_each_queue(broker, superuser_client):
    make_tasks(broker, S.ARCHIVED, Q, count=2)  # two processed and failed attempts today
    make_tasks(broker, S.SCHEDULED, Q, count=3)
    make_tasks(broker, S.PENDING, Q, count=4, enqueued_at=broker.clock() - 125)
    broker.pause(Q)

    response = superuser_client.get(DASHBOARD)

    assert response.status_code == 200
    queues = {queue["name"]: queue for queue in response.context["queues"]}
    assert set(queues) >= {Q, "default", "low"}  # Redis's queues and those in settings
    emails = queues[Q]
    assert [(state, count) for state, count, _ in emails["states"]][:6] == [
        ("pending", 4), ("active", 0), ("scheduled", 3), ("retry", 0), ("archived", 2), ("completed", 0),
    ]  # fmt: skip
    assert emails["stats"].processed_today == 2
    assert emails["stats"].failed_today == 2
    assert emails["oldest_pending"] == "2m 5s"
    row = re.search(rf'<tr data-queue="{Q}">(.*?)</tr>', response.text, re.S).group(1)
    assert "paused" in row
    assert 'value="resume"' in row
    assert 'value="Empty queue"' in row
    assert f'href="{tasks_url("scheduled", queue=Q)}"' in row


def test_the_dashboard_lists_live_workers_and_their_tasks(broker, superuser_client, run_worker):
    task = testapp_tasks.block.using(queue="default").enqueue("dash")
    with run_worker(queues={"default": 2, "low": 1}, concurrency=3):
        wait_for(lambda: broker.client.llen(testapp_tasks.report_key("dash:started")), message="task start")
        wait_for(lambda: any(w.get("active") for w in broker.workers()), message="heartbeat")

        response = superuser_client.get(DASHBOARD)

        [worker] = response.context["workers"]
        assert worker["queues"] == ["default (2)", "low (1)"]
        assert worker["concurrency"] == 3
        assert [t["id"] for t in worker["tasks"]] == [task.id]
        assert f'href="{task_url(task.id, "default")}"' in response.text
        broker.client.set(testapp_tasks.report_key("release:dash"), "1")
    assert "No live workers." in superuser_client.get(DASHBOARD).text


def test_the_dashboard_draws_the_history_as_inline_svg(broker, superuser_client):
    qk = broker.queue(Q)
    today = timezone.now().date()
    broker.client.set(qk.processed(today.isoformat()), 40)
    broker.client.set(qk.failed(today.isoformat()), 7)
    broker.client.set(qk.processed((today - timedelta(days=3)).isoformat()), 12)
    broker.client.sadd(broker.keys.queues, Q)

    response = superuser_client.get(DASHBOARD)

    svg = str(response.context["chart"])
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert f"<title>{today.isoformat()}: 40 processed, 7 failed</title>" in svg
    assert svg.count("<rect") == 3 + 2  # two bars today, one three days ago, two legend keys
    assert response.context["chart_totals"] == (52, 7)
    assert "<script" not in response.text.split('id="rtq-history"')[1].split("</div>")[0]
    assert not re.search(r'(src|href)="https?://', response.text)  # nothing from the internet

    one_queue = superuser_client.get(DASHBOARD + "?chart=low")
    assert one_queue.context["chart_totals"] == (0, 0)


def test_chart_helpers():
    assert [nice_ceiling(n) for n in (0, 1, 3, 10, 11, 45, 99, 101, 250, 5001)] == [
        1, 1, 5, 10, 20, 50, 100, 200, 500, 10000,
    ]  # fmt: skip
    empty = history_chart([("2026-11-01", 0, 0)])
    assert "<rect" in empty  # the legend only
    assert "2026-11-01" not in empty and "11-01" in empty


# Task lists


@pytest.mark.parametrize("state", ["pending", "active", "scheduled", "retry", "archived", "completed"])
def test_each_state_has_a_list(broker, superuser_client, state):
    ids = make_tasks(broker, state, Q, count=2)

    response = superuser_client.get(tasks_url(state, queue=Q))

    assert response.status_code == 200
    assert sorted(row_ids(response)) == sorted(ids)
    assert response.context["total"] == 2


def test_the_list_pages_through_redis(broker, inspector, superuser_client):
    count = 2 * PER_PAGE + 7
    make_tasks(broker, S.ARCHIVED, Q, count=count)
    newest_first = [task.id for task in inspector.list_tasks(Q, S.ARCHIVED, limit=count)]

    first = superuser_client.get(tasks_url("archived", queue=Q))
    third = superuser_client.get(tasks_url("archived", queue=Q, page="3"))
    beyond = superuser_client.get(tasks_url("archived", queue=Q, page="99"))

    assert row_ids(first) == newest_first[:PER_PAGE]
    assert row_ids(third) == newest_first[2 * PER_PAGE :]
    assert row_ids(beyond) == row_ids(third)  # past the end: the last page
    assert f"{count} tasks, page 1 of 3" in text(first)
    assert f'href="{tasks_url("archived", queue=Q, page="2")}"' in text(first)


def test_the_list_reads_only_its_page(broker, superuser_client, monkeypatch):
    """A page is one ZCARD and one ZRANGE with offsets, never the whole list."""
    enqueue(broker, Q, 30)
    calls = []
    real_zrange = broker.client.zrange

    def zrange(key, start, end, **options):
        calls.append((key, start, end))
        return real_zrange(key, start, end, **options)

    monkeypatch.setattr(broker.client, "zrange", zrange)
    response = superuser_client.get(tasks_url("pending", queue=Q, page="1"))

    assert len(row_ids(response)) == 30
    assert calls == [(broker.queue(Q).pending, 0, 29)]  # the paginator stops at the count


def test_the_queue_filter(broker, superuser_client):
    in_emails = make_tasks(broker, S.SCHEDULED, Q)
    in_billing = make_tasks(broker, S.SCHEDULED, "billing", count=2)

    by_default = superuser_client.get(tasks_url("scheduled"))
    billing = superuser_client.get(tasks_url("scheduled", queue="billing"))
    emails = superuser_client.get(tasks_url("scheduled", queue=Q))

    assert by_default.context["queue"] == "billing"  # the first queue with such tasks
    assert sorted(row_ids(billing)) == sorted(in_billing)
    assert row_ids(emails) == in_emails
    assert "billing (2)" in text(emails) and f"{Q} (1)" in text(emails)


def test_search_by_id_opens_the_task_in_any_queue(broker, superuser_client):
    [task_id] = make_tasks(broker, S.RETRY, "billing")

    found = superuser_client.get(tasks_url("pending", queue=Q, id=task_id))
    missing = superuser_client.get(tasks_url("pending", queue=Q, id="nope"))

    assert found.status_code == 302
    assert found["Location"] == task_url(task_id, "billing")
    assert missing.status_code == 200
    assert messages_of(missing) == ["No task with id 'nope' in any queue."]


def test_search_by_name_looks_at_the_top_of_the_list(broker, superuser_client, monkeypatch):
    monkeypatch.setattr("django_rtq.admin_views.tasks.NAME_SEARCH_SCAN", 5)
    mails = enqueue_named(broker, "app.send_mail", 2)
    enqueue_named(broker, "app.resize", 2)
    late_mail = enqueue_named(broker, "app.Send_Mail_Later", 1)  # pending: the 5th
    enqueue_named(broker, "app.send_mail", 1)  # the 6th: past the scan

    response = superuser_client.get(tasks_url("pending", queue=Q, name="SEND_MAIL"))

    assert row_ids(response) == mails + late_mail
    assert "3 of the first 5 pending tasks have a name containing" in text(response)
    assert "Name and partition search looks at the\n  5 tasks at the top of this list only" in text(response)
    assert NAME_SEARCH_SCAN == 1000


def test_search_by_name_in_the_inspector_reads_newest_first_for_archived(broker, inspector):
    ids = make_tasks(broker, S.ARCHIVED, Q, count=3)
    broker.client.zadd(broker.queue(Q).archived, {ids[0]: 1, ids[1]: 3, ids[2]: 2})

    assert [t.id for t in inspector.search_by_name(Q, S.ARCHIVED, "NOOP", scan=2)] == [ids[1], ids[2]]
    assert inspector.search_by_name(Q, S.ARCHIVED, "other") == []
    assert inspector.search_by_name("empty", S.ARCHIVED, "noop") == []


def test_unknown_states_are_not_found(broker, superuser_client):
    assert superuser_client.get(tasks_url("nonsense")).status_code == 404


# The task page


def test_the_task_page_shows_everything_known(broker, superuser_client, run_worker):
    message = testapp_tasks.always_fails.using(priority=7, timeout=12, retention=30).enqueue("page")
    with run_worker():
        wait_for(lambda: ids_in(broker, "default", S.ARCHIVED) == [message.id], message="archived")

    response = superuser_client.get(task_url(message.id, "default"))

    assert response.status_code == 200
    page = text(response)
    assert "tests.testapp.tasks.always_fails" in page
    assert '[\n  "page"\n]' in page  # args, as JSON
    options = dict(response.context["options"])
    assert options["Priority"] == 7
    assert options["Timeout"] == "12s"
    assert options["Max retries"] == 2
    assert "2 retries of at most 2" in page
    assert "ValueError: </strong>this task always fails" in page
    assert "Traceback (most recent call last)" in page
    assert 'raise ValueError("this task always fails")' in page
    assert 'id="rtq-progress"' not in page and 'id="rtq-children"' not in page
    assert [offer.action for offer in response.context["actions"]] == ["run", "delete"]


def test_the_task_page_shows_progress_parent_and_children(broker, superuser_client):
    [parent] = enqueue(broker, Q)
    [child_id] = enqueue(broker, Q, parent=parent)
    info = {
        "progress": {"done": 3, "total": 12},
        "children": ["c-1", {"id": "c-2", "queue": "low", "state": "x"}],
    }
    broker.client.hset(broker.queue(Q).info, child_id, json.dumps(info))

    response = superuser_client.get(task_url(child_id))

    assert response.context["progress"] == {"done": 3, "total": 12, "percent": 25.0}
    assert '<progress class="rtq-progress" value="3" max="12">' in response.text
    assert f'href="{reverse("admin:django_rtq_task", args=[parent])}"' in response.text
    children = response.context["children"]
    assert [(c["id"], c["details"]) for c in children] == [("c-1", {}), ("c-2", {"state": "x"})]
    assert f'href="{task_url("c-2", "low")}"' in response.text


def test_a_waiting_workflow_shows_its_progress_and_children_and_can_be_cancelled(
    broker, superuser_client, run_worker
):
    from django_rtq.workflows import group

    workflow_id = group(testapp_tasks.block.si("wf-a"), testapp_tasks.block.si("wf-b")).enqueue()
    with run_worker(concurrency=2):
        for name in ("wf-a", "wf-b"):
            wait_for(lambda name=name: broker.client.llen(testapp_tasks.report_key(f"{name}:started")))
        listing = superuser_client.get(tasks_url("waiting", queue="default"))
        assert row_ids(listing) == [workflow_id]

        page = superuser_client.get(task_url(workflow_id, "default"))

        assert page.context["progress"] == {"done": 0, "total": 2, "percent": 0.0}
        children = [child["id"] for child in page.context["children"]]
        assert len(children) == 2
        for child_id in children:
            assert f'href="{reverse("admin:django_rtq_task", args=[child_id])}"' in page.text
            child = superuser_client.get(reverse("admin:django_rtq_task", args=[child_id]))
            assert child.context["task"].state == S.ACTIVE
            assert f'href="{task_url(workflow_id, "default")}"' in child.text  # its parent
        assert 'id="rtq-workflow"' in page.text
        assert [offer.action for offer in page.context["actions"]] == ["delete", "cancel"]

        cancelled = confirm(
            superuser_client, ACTION_URL, action("waiting", "cancel", [workflow_id], "selected", "default")
        )

        assert messages_of(cancelled)[0].startswith("Cancellation of 1 task requested")
        assert workflow_id in ids_in(broker, "default", S.ARCHIVED)  # at once, not by a worker
        for name in ("wf-a", "wf-b"):
            broker.client.set(testapp_tasks.report_key(f"release:{name}"), "1")


def test_a_task_not_in_redis_links_to_its_finished_record(broker, superuser_client):
    FinishedTask.objects.create(
        task_id="gone-1", task_name="t", queue=Q, status="succeeded", finished_at=timezone.now()
    )

    gone = superuser_client.get(task_url("gone-1"))
    never = superuser_client.get(task_url("never"))

    assert gone.status_code == 404
    assert 'href="/admin/django_rtq/finishedtask/gone-1/change/"' in gone.text
    assert never.status_code == 404
    assert "See its finished record" not in never.text


def test_a_stale_queue_in_the_link_still_finds_the_task(broker, superuser_client):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)
    assert superuser_client.get(task_url(task_id, "low")).context["task"].queue == Q


def test_task_ids_with_slashes_and_spaces(broker, superuser_client):
    [task_id] = enqueue(broker, Q, id="reports/2026 11/x?y")
    response = superuser_client.get(task_url(task_id))
    assert response.status_code == 200
    assert response.context["task"].id == task_id


# Actions


def action(state: str, name: str, ids=(), scope: str = "selected", queue: str = Q) -> dict:
    return {"action": name, "queue": queue, "state": state, "ids": list(ids), "scope": scope}


def test_run_now_one_task_from_its_page(broker, superuser_client):
    [task_id, other] = make_tasks(broker, S.ARCHIVED, Q, count=2)
    page = superuser_client.get(task_url(task_id))
    assert 'value="Run now"' in page.text

    response = confirm(
        superuser_client,
        ACTION_URL,
        {**action("archived", "run", [task_id]), "next": tasks_url("archived", queue=Q)},
    )

    assert response.status_code == 302
    assert response["Location"] == tasks_url("archived", queue=Q)
    assert ids_in(broker, Q, S.PENDING) == [task_id]
    assert ids_in(broker, Q, S.ARCHIVED) == [other]
    assert messages_of(response) == [f"1 task of queue '{Q}' moved to pending."]


def test_the_confirmation_page_lists_the_tasks_and_acts_on_nothing(broker, superuser_client):
    ids = make_tasks(broker, S.SCHEDULED, Q, count=3)

    response = superuser_client.post(ACTION_URL, action("scheduled", "delete", ids[:2]))

    assert response.status_code == 200
    assert f"Delete: 2 selected tasks of queue '{Q}'?" in text(response)
    for task_id in ids[:2]:
        assert f'<input type="hidden" name="ids" value="{task_id}">' in response.text
    assert sorted(ids_in(broker, Q, S.SCHEDULED)) == sorted(ids)


@pytest.mark.parametrize(
    "state, name, to",
    [
        ("scheduled", "run", S.PENDING),
        ("scheduled", "archive", S.ARCHIVED),
        ("scheduled", "delete", None),
        ("retry", "run", S.PENDING),
        ("retry", "archive", S.ARCHIVED),
        ("retry", "delete", None),
        ("archived", "run", S.PENDING),
        ("archived", "delete", None),
    ],
)
def test_acting_on_the_selected_tasks(broker, superuser_client, state, name, to):
    ids = make_tasks(broker, S(state), Q, count=3)

    response = confirm(superuser_client, ACTION_URL, action(state, name, ids[:2]))

    assert response.status_code == 302
    assert response["Location"] == tasks_url(state, queue=Q)
    assert ids_in(broker, Q, S(state)) == ids[2:]
    if to is not None:
        assert sorted(ids_in(broker, Q, to)) == sorted(ids[:2])
    else:
        assert broker.client.hmget(broker.queue(Q).state, ids[:2]) == [None, None]
    done = {"run": "moved to pending", "archive": "archived", "delete": "deleted"}[name]
    assert messages_of(response) == [f"2 tasks of queue '{Q}' {done}."]


@pytest.mark.parametrize("state, name", [("scheduled", "run"), ("retry", "archive"), ("archived", "delete")])
def test_acting_on_every_task_in_a_state(broker, superuser_client, state, name):
    make_tasks(broker, S(state), Q, count=4)
    other_queue = make_tasks(broker, S(state), "billing")
    asked = superuser_client.post(ACTION_URL, action(state, name, scope="all"))
    assert f"all 4 {state} tasks of queue '{Q}'?" in text(asked)

    response = confirm(superuser_client, ACTION_URL, action(state, name, scope="all"))

    [job] = Operations().bulk_jobs(Q)
    assert response["Location"] == bulk_url(Q, job.id)
    assert ids_in(broker, Q, S(state)) == []
    assert ids_in(broker, "billing", S(state)) == other_queue
    progress = superuser_client.get(response["Location"])
    done = {"run": "moved to pending", "archive": "archived", "delete": "deleted"}[name]
    assert f"4 of 4 tasks {done}" in text(progress)
    assert progress.context["job"]["percent"] == 100
    assert 'http-equiv="refresh"' not in progress.text
    assert "Carry on here" not in progress.text


def test_tasks_in_another_state_are_reported_with_the_reason(broker, superuser_client):
    ids = make_tasks(broker, S.ARCHIVED, Q, count=2)
    broker.client.hset(broker.queue(Q).state, ids[1], "active")  # as if it was run and claimed

    response = confirm(superuser_client, ACTION_URL, action("archived", "run", [*ids, "gone-1"]))

    assert messages_of(response) == [
        f"1 task of queue '{Q}' moved to pending.",
        f"Task {ids[1]!r} was not moved to pending: it is active; run applies to scheduled, retry, "
        "archived tasks.",
        f"1 selected task no longer in queue '{Q}' ('gone-1'): deleted, or gone at the end of its retention.",
    ]


def test_tasks_that_moved_after_they_were_found_are_reported_left_alone(
    broker, superuser_client, monkeypatch
):
    ids = make_tasks(broker, S.ARCHIVED, Q, count=3)
    real_run_now = manual.run_now

    def run_now_after_another_hand(broker, queue, task_ids):  # someone deleted one meanwhile
        manual.delete(broker, queue, [ids[0]])
        return real_run_now(broker, queue, task_ids)

    monkeypatch.setattr(manual, "run_now", run_now_after_another_hand)

    response = confirm(superuser_client, ACTION_URL, action("archived", "run", ids))

    assert messages_of(response) == [
        f"2 tasks of queue '{Q}' moved to pending.",
        "1 selected task left alone: no longer in a state run applies to (or gone) by the time the "
        "action ran.",
    ]
    assert sorted(ids_in(broker, Q, S.PENDING)) == sorted(ids[1:])


def test_several_skipped_for_one_reason_make_one_message(broker, superuser_client):
    ids = make_tasks(broker, S.COMPLETED, Q, count=7)

    response = confirm(superuser_client, ACTION_URL, action("archived", "run", ids))

    listed = ", ".join(repr(task_id) for task_id in ids[:5])
    assert messages_of(response) == [
        f"7 selected tasks were not moved to pending ({listed} and 2 more); each: it is completed; "
        "run applies to scheduled, retry, archived tasks."
    ]
    assert sorted(ids_in(broker, Q, S.COMPLETED)) == sorted(ids)


def cancelled_workflow() -> str:
    """A workflow in queue "default", archived as cancelled with its child (which never ran)."""
    from django_rtq.workflows import group

    workflow_id = group(testapp_tasks.block.si("never-runs")).enqueue()
    assert Operations().act(Action.CANCEL, [workflow_id]).count == 1
    return workflow_id


def test_running_a_finished_workflow_again_is_refused_with_a_message(broker, superuser_client):
    workflow_id = cancelled_workflow()
    data = action("archived", "run", [workflow_id], queue="default")

    response = confirm(superuser_client, ACTION_URL, data)

    assert response.status_code == 302
    assert messages_of(response) == [
        f"Task {workflow_id!r} was not moved to pending: it is a workflow, and a finished workflow "
        "cannot be run again: enqueue it anew."
    ]
    assert workflow_id in ids_in(broker, "default", S.ARCHIVED)


def test_running_every_archived_task_leaves_workflows_in_place_and_says_so(broker, superuser_client):
    tasks = make_tasks(broker, S.ARCHIVED, "default", count=2)
    workflow_id = cancelled_workflow()

    response = confirm(superuser_client, ACTION_URL, action("archived", "run", scope="all", queue="default"))

    assert ids_in(broker, "default", S.ARCHIVED) == [workflow_id]
    assert set(tasks) <= set(ids_in(broker, "default", S.PENDING))
    progress = text(superuser_client.get(response["Location"]))
    assert "1 workflow left in place: a finished workflow cannot run again" in progress


def test_actions_a_state_does_not_allow_are_refused(broker, superuser_client):
    ids = make_tasks(broker, S.ARCHIVED, Q)
    [active] = make_tasks(broker, S.ACTIVE, Q)

    def refused(data: dict) -> list[str]:
        return messages_of(superuser_client.post(ACTION_URL, {**data, "confirm": "yes"}))

    assert refused(action("archived", "archive", ids)) == ["That action does not apply to archived tasks."]
    assert refused(action("active", "run", [active])) == ["That action does not apply to active tasks."]
    assert refused(action("active", "cancel", scope="all")) == ["Cancel applies to selected tasks only."]
    assert refused(action("archived", "run")) == ["Select tasks first: nothing was done."]
    assert refused(action("archived", "run", ids, queue="nope")) == ["Unknown queue or state."]
    assert ids_in(broker, Q, S.ARCHIVED) == ids
    assert ids_in(broker, Q, S.ACTIVE) == [active]


def test_next_must_stay_on_the_site(broker, superuser_client):
    ids = make_tasks(broker, S.ARCHIVED, Q)
    data = {**action("archived", "delete", ids), "next": "https://evil.example.com/"}
    response = confirm(superuser_client, ACTION_URL, data)
    assert response["Location"] == tasks_url("archived", queue=Q)


def test_cancel_an_active_task(broker, superuser_client, run_worker):
    message = testapp_tasks.block.enqueue("cancel-me")
    with run_worker():
        wait_for(lambda: broker.client.llen(testapp_tasks.report_key("cancel-me:started")), message="start")
        listing = superuser_client.get(tasks_url("active", queue="default"))
        assert row_ids(listing) == [message.id]
        assert '<option value="cancel">Cancel</option>' in listing.text

        response = confirm(
            superuser_client, ACTION_URL, action("active", "cancel", [message.id], queue="default")
        )

        assert messages_of(response) == [
            "Cancellation of 1 task requested: a running task is stopped by its worker, a waiting "
            "workflow at once; either ends archived."
        ]
        wait_for(lambda: ids_in(broker, "default", S.ARCHIVED) == [message.id], message="cancelled")


def test_cancel_with_no_worker_listening_says_so(broker, superuser_client):
    [task_id] = make_tasks(broker, S.ACTIVE, Q)
    response = confirm(superuser_client, ACTION_URL, action("active", "cancel", [task_id]))
    assert messages_of(response) == [
        "1 cancellation reached no worker: no worker is listening now, or the task had finished. "
        "An active task whose worker died is recovered when its lease expires."
    ]


def test_pause_and_resume_a_queue(broker, superuser_client):
    enqueue(broker, Q)
    asked = superuser_client.post(QUEUE_ACTION_URL, {"queue": Q, "action": "pause"})
    assert f"Pause queue '{Q}'?" in text(asked)
    assert not broker.is_paused(Q)

    paused = superuser_client.post(QUEUE_ACTION_URL, {"queue": Q, "action": "pause", "confirm": "yes"})
    assert paused["Location"] == DASHBOARD
    assert messages_of(paused) == [f"Queue '{Q}' paused."]
    assert broker.is_paused(Q)
    again = superuser_client.post(QUEUE_ACTION_URL, {"queue": Q, "action": "pause", "confirm": "yes"})
    assert messages_of(again) == [f"Queue '{Q}' was already paused."]
    resumed = superuser_client.post(QUEUE_ACTION_URL, {"queue": Q, "action": "resume", "confirm": "yes"})
    assert messages_of(resumed) == [f"Queue '{Q}' resumed."]
    assert not broker.is_paused(Q)
    unknown = superuser_client.post(QUEUE_ACTION_URL, {"queue": "nope", "action": "pause", "confirm": "yes"})
    assert messages_of(unknown) == ["Unknown queue or action."]


def test_a_paused_queue_is_not_worked_until_resumed(broker, superuser_client, run_worker):
    superuser_client.post(QUEUE_ACTION_URL, {"queue": "default", "action": "pause", "confirm": "yes"})
    message = testapp_tasks.record.enqueue("paused-run")
    with run_worker():
        wait_for(lambda: broker.workers(), message="heartbeat")
        assert ids_in(broker, "default", S.PENDING) == [message.id]
        superuser_client.post(QUEUE_ACTION_URL, {"queue": "default", "action": "resume", "confirm": "yes"})
        wait_for(lambda: broker.client.llen(testapp_tasks.report_key("paused-run")), message="ran")


def test_redis_unreachable_gives_a_clear_page(broker, superuser_client, settings):
    from django_rtq.connection import reset_broker

    settings.RTQ = {**settings.RTQ, "REDIS_URL": "redis://127.0.0.1:1/0"}
    reset_broker()
    response = superuser_client.get(DASHBOARD)
    assert response.status_code == 503
    assert "cannot reach Redis" in text(response)


# Actions on whole states: bulk jobs and their progress page


@pytest.fixture
def slow_bulk(monkeypatch):
    """Bulk jobs of 2 tasks a page, and requests that work on them for one page only."""
    monkeypatch.setattr("django_rtq.broker.bulk.PAGE", 2)
    monkeypatch.setattr("django_rtq.operations.REQUEST_BUDGET", 0)


def test_a_bulk_action_too_big_for_the_request_shows_its_progress_and_carries_on_here(
    broker, superuser_client, slow_bulk, monkeypatch
):
    make_tasks(broker, S.ARCHIVED, Q, count=5)

    response = confirm(superuser_client, ACTION_URL, action("archived", "delete", scope="all"))

    [job] = Operations().bulk_jobs(Q)
    assert response["Location"] == bulk_url(Q, job.id)
    assert len(ids_in(broker, Q, S.ARCHIVED)) == 3  # one page of two, then the request answered
    page = superuser_client.get(response["Location"])
    assert page.status_code == 200
    assert f"Delete: archived tasks of queue '{Q}'" in text(page)
    assert "2 of 5 tasks deleted" in text(page)
    assert page.context["job"]["percent"] == 40
    assert page.context["job"]["started_by"] == "admin"
    assert '<progress class="rtq-progress" value="40" max="100">' in page.text
    assert '<meta http-equiv="refresh" content="2">' in page.text
    assert "Running: now on the archived tasks" in text(page)
    assert "Running workers that serve queue emails" in text(page)
    assert 'value="Carry on here"' in page.text

    monkeypatch.setattr("django_rtq.operations.REQUEST_BUDGET", 1.0)
    carried = superuser_client.post(carry_on_url(Q, job.id))

    assert carried.status_code == 302
    assert carried["Location"] == bulk_url(Q, job.id)
    assert ids_in(broker, Q, S.ARCHIVED) == []
    assert messages_of(carried) == ["Finished: 5 of 5 tasks deleted."]
    finished = superuser_client.get(carried["Location"])
    assert finished.context["job"]["percent"] == 100
    assert "Finished " in text(finished)
    assert 'http-equiv="refresh"' not in finished.text
    assert "Carry on here" not in finished.text


def test_carry_on_while_someone_else_holds_the_job_says_so(broker, superuser_client, slow_bulk):
    make_tasks(broker, S.ARCHIVED, Q, count=5)
    job = Operations().start_bulk(Action.DELETE, Q, [S.ARCHIVED], budget=0)
    lock = broker.client.lock(broker.queue(Q).bulk_lock(job.id), timeout=10)  # as a worker would
    assert lock.acquire(blocking=False)

    carried = superuser_client.post(carry_on_url(Q, job.id))

    lock.release()
    assert messages_of(carried) == ["A worker is carrying it on right now: this page follows its progress."]
    assert len(ids_in(broker, Q, S.ARCHIVED)) == 3


def test_the_progress_page_of_an_unknown_job_is_not_found(broker, superuser_client):
    assert superuser_client.get(bulk_url(Q, "nope")).status_code == 404
    assert superuser_client.post(carry_on_url(Q, "nope")).status_code == 404
    assert superuser_client.get(carry_on_url(Q, "nope")).status_code == 405  # POST only


def test_viewers_follow_progress_but_may_not_carry_on_or_empty_a_queue(
    broker, superuser_client, viewer_client, slow_bulk
):
    make_tasks(broker, S.ARCHIVED, Q, count=5)
    job = Operations().start_bulk(Action.DELETE, Q, [S.ARCHIVED], budget=0)

    page = viewer_client.get(bulk_url(Q, job.id))

    assert page.status_code == 200
    assert "2 of 5 tasks deleted" in text(page)
    assert "Carry on here" not in page.text
    assert viewer_client.post(carry_on_url(Q, job.id)).status_code == 403
    for data in ({"queue": Q, "action": "purge"}, {"queue": Q, "action": "purge", "confirm": "yes"}):
        assert viewer_client.post(QUEUE_ACTION_URL, data).status_code == 403
    assert len(ids_in(broker, Q, S.ARCHIVED)) == 3
    assert [j.done for j in Operations().bulk_jobs(Q)] == [2]


def test_empty_a_queue_deletes_every_task_but_the_active_ones(broker, superuser_client):
    # The states made by claiming come first: each claims the queue's oldest pending tasks.
    [active] = make_tasks(broker, S.ACTIVE, Q)
    for state in (S.ARCHIVED, S.RETRY, S.COMPLETED, S.SCHEDULED, S.WAITING, S.PENDING):
        make_tasks(broker, state, Q, count=2)
    other_queue = make_tasks(broker, S.PENDING, "billing")
    asked = superuser_client.post(QUEUE_ACTION_URL, {"queue": Q, "action": "purge"})
    assert (
        f"Empty queue '{Q}'? Its 12 tasks in the states waiting, scheduled, retry, pending, archived, "
        "completed will be deleted. Active tasks are left to their workers." in text(asked)
    )

    response = confirm(superuser_client, QUEUE_ACTION_URL, {"queue": Q, "action": "purge"})

    [job] = Operations().bulk_jobs(Q)
    assert response["Location"] == bulk_url(Q, job.id)
    assert {state: ids_in(broker, Q, state) for state in PURGE_STATES} == {
        state: [] for state in PURGE_STATES
    }
    assert ids_in(broker, Q, S.ACTIVE) == [active]
    assert ids_in(broker, "billing", S.PENDING) == other_queue
    page = superuser_client.get(response["Location"])
    assert f"Empty queue '{Q}'" in text(page)
    assert "12 of 12 tasks deleted" in text(page)


def test_the_dashboard_lists_bulk_jobs_running_first(broker, superuser_client, slow_bulk):
    make_tasks(broker, S.ARCHIVED, Q, count=5)
    make_tasks(broker, S.SCHEDULED, Q)
    running = Operations().start_bulk(Action.DELETE, Q, [S.ARCHIVED], budget=0)
    finished = Operations().start_bulk(Action.RUN, Q, [S.SCHEDULED], budget=1.0)
    assert not running.finished and finished.finished
    assert [job.id for job in Operations().bulk_jobs()] == [finished.id, running.id]  # latest first

    response = superuser_client.get(DASHBOARD)

    assert [job["id"] for job in response.context["bulk_jobs"]] == [running.id, finished.id]
    rows = re.findall(r'<tr data-job="([^"]+)">(.*?)</tr>', response.text, re.S)
    assert [job_id for job_id, _ in rows] == [running.id, finished.id]
    assert f'href="{bulk_url(Q, running.id)}"' in rows[0][1]
    assert "Delete: archived tasks of queue" in html.unescape(rows[0][1])
    assert "running" in rows[0][1] and "finished" in rows[1][1]

    finished.finished_at = broker.clock() - 2 * 3600  # finished long ago: off the dashboard
    broker.client.hset(broker.queue(Q).bulk, finished.id, finished.to_json())
    assert [job["id"] for job in superuser_client.get(DASHBOARD).context["bulk_jobs"]] == [running.id]


# The ORM mirror


@pytest.fixture
def finished_rows(db):
    now = timezone.now()
    return [
        FinishedTask.objects.create(
            task_id=f"f-{i}",
            task_name=name,
            queue=queue,
            status=status,
            finished_at=now - timedelta(days=i),
            args=[i],
        )
        for i, (name, queue, status) in enumerate(
            [
                ("app.send_mail", "emails", "succeeded"),
                ("app.send_mail", "emails", "failed"),
                ("app.resize", "images", "succeeded"),
            ]
        )
    ]


def test_the_finished_task_list_searches_and_filters(broker, superuser_client, finished_rows):
    url = "/admin/django_rtq/finishedtask/"

    def listed(query: str) -> list[str]:
        response = superuser_client.get(url + query)
        assert response.status_code == 200
        return sorted(row.task_id for row in response.context["cl"].result_list)

    assert listed("") == ["f-0", "f-1", "f-2"]
    assert listed("?q=f-1") == ["f-1"]
    assert listed("?q=f-") == []  # ids match exactly
    assert listed("?q=resize") == ["f-2"]
    assert listed("?status__exact=failed") == ["f-1"]
    assert listed("?queue__exact=emails") == ["f-0", "f-1"]
    assert listed("?task_name__exact=app.resize") == ["f-2"]
    today = timezone.now()
    assert "f-0" in listed(f"?finished_at__year={today.year}&finished_at__month={today.month}")
    assert "Add finished task" not in superuser_client.get(url).text


def test_the_finished_task_page_links_to_the_live_task(broker, superuser_client, finished_rows):
    [live] = make_tasks(broker, S.ARCHIVED, Q)
    FinishedTask.objects.filter(task_id="f-0").update(task_id=live)

    live_page = superuser_client.get(f"/admin/django_rtq/finishedtask/{live}/change/")
    gone_page = superuser_client.get("/admin/django_rtq/finishedtask/f-1/change/")

    assert live_page.status_code == 200
    assert f'<a href="{task_url(live)}">Live task (archived)</a>' in live_page.text
    assert "This task is no longer in Redis." in text(gone_page)
    assert 'name="_save"' not in live_page.text  # read only


def test_the_finished_task_page_shows_no_live_link_without_the_permission(broker, finished_rows):
    [live] = make_tasks(broker, S.ARCHIVED, Q)
    FinishedTask.objects.filter(task_id="f-0").update(task_id=live)
    client = logged_in(user_with("view_finishedtask"))

    page = client.get(f"/admin/django_rtq/finishedtask/{live}/change/")

    assert page.status_code == 200
    assert "Live task" not in page.text

"""The REST API (django_rtq.api) against a real Redis: access, enqueueing, tasks, queues, workers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIClient

from django_rtq import operations
from django_rtq.broker import bulk
from django_rtq.broker.bulk import PURGE_STATES
from django_rtq.broker.states import TaskState
from django_rtq.models import FinishedTask
from django_rtq.operations import Operations
from tests.support.factories import make_tasks
from tests.support.polling import wait_for
from tests.support.runs import task_state
from tests.testapp import api_tasks, tasks
from tests.testapp.tasks import report_key

pytestmark = pytest.mark.django_db

API = "/rtq/api/"
GREET = "tests.testapp.api_tasks.greet"


@pytest.fixture
def admin() -> User:
    return User(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def api(prefix, admin) -> APIClient:
    """A client authenticated as an admin user, on this test's key prefix."""
    client = APIClient()
    client.force_authenticate(admin)
    return client


def enqueue(api: APIClient, name: str = GREET, **body):
    return api.post(f"{API}task-types/{name}/enqueue/", body, format="json")


# Access


def test_anonymous_requests_are_refused(prefix):
    response = APIClient().get(f"{API}queues/")
    assert response.status_code == 403  # DRF's default: session authentication first


def test_anonymous_requests_get_401_with_basic_authentication(prefix, settings):
    settings.RTQ = {
        **settings.RTQ,
        "API_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    }
    response = APIClient().get(f"{API}queues/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Basic")


def test_a_user_without_the_permissions_is_refused(prefix, django_user_model):
    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user("someone"))
    for url in ("queues/", "workers/", "finished/", "task-types/", "tasks/x/"):
        assert client.get(API + url).status_code == 403, url
    assert enqueue(client, name=GREET, args=["x"]).status_code == 403


def test_a_logged_in_staff_user_with_the_permission_is_allowed(prefix, django_user_model):
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_rtq", codename="view_livetask")
    )
    client = APIClient()
    client.login(username="staff", password="pw")
    assert client.get(f"{API}queues/").status_code == 200


def test_permission_classes_come_from_settings(prefix, settings):
    client = APIClient()
    client.force_authenticate(User(username="someone"))
    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]}
    assert client.get(f"{API}queues/").status_code == 200
    assert APIClient().get(f"{API}queues/").status_code == 403

    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"]}
    assert APIClient().get(f"{API}queues/").status_code == 200


def test_the_permission_classes_are_the_whole_policy_and_actions_keep_the_users_name(
    prefix, settings, broker, inspector
):
    # The operations do not check the user's Django permissions again once the classes admitted
    # the request: a replaced policy stays replaced, for actions on whole states too.
    [task_id] = make_tasks(broker, TaskState.SCHEDULED, "default")
    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]}
    client = APIClient()
    client.force_authenticate(User(username="someone"))  # no permission of django-rtq
    response = start_bulk(client, action="run", state="scheduled")
    assert response.status_code == 202, response.content
    assert response.json()["started_by"] == "someone"
    assert task_state(inspector, task_id) == TaskState.PENDING


def test_a_malformed_permission_setting_is_reported(prefix, settings, api):
    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": "rest_framework.permissions.AllowAny"}
    with pytest.raises(ImproperlyConfigured, match="API_PERMISSION_CLASSES"):
        api.get(f"{API}queues/")
    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": ["no.such.Permission"]}
    with pytest.raises(ImproperlyConfigured, match=r"cannot import 'no\.such\.Permission'"):
        api.get(f"{API}queues/")


# Task types and enqueueing


def test_only_exposed_task_types_are_listed(api):
    response = api.get(f"{API}task-types/")
    assert response.status_code == 200
    by_name = {item["name"]: item for item in response.json()}
    assert "tests.testapp.api_tasks.hidden" not in by_name
    assert "tests.testapp.tasks.noop" not in by_name
    assert by_name[GREET] == {
        "name": GREET,
        "queue": "default",
        "parameters": [
            {"name": "name", "kind": "positional_or_keyword", "required": True},
            {"name": "count", "kind": "positional_or_keyword", "required": False},
        ],
        "doc": "Say hello `count` times.",
    }
    assert by_name["tests.testapp.api_tasks.low"]["queue"] == "low"


def test_enqueue_creates_a_pending_task(api, inspector):
    response = enqueue(api, args=["ada"], kwargs={"count": 2})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["task"] == GREET
    assert body["queue"] == "default"
    assert body["state"] == "pending"
    assert body["process_at"] is None
    assert response["Location"] == body["url"] == f"http://testserver{API}tasks/{body['id']}/"
    task = inspector.get_task(body["id"])
    assert task.state == TaskState.PENDING
    assert (task.message.args, task.message.kwargs) == (["ada"], {"count": 2})


def test_enqueue_takes_options(api, inspector):
    response = enqueue(api, args=["ada"], queue="low", priority=7, delay=60, task_id="my-id")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["id"], body["queue"], body["state"]) == ("my-id", "low", "scheduled")
    assert body["process_at"] is not None
    task = inspector.get_task("my-id")
    assert (task.queue, task.state, task.message.priority) == ("low", TaskState.SCHEDULED, 7)


def test_enqueue_takes_the_known_queues(api, inspector):
    tasks.noop.using(queue="extra").enqueue()  # known from now on, though not configured
    response = enqueue(api, args=["ada"], queue="extra")
    assert response.status_code == 201, response.content
    assert inspector.get_task(response.json()["id"]).queue == "extra"
    response = enqueue(api, args=["ada"], queue="never")
    assert response.status_code == 400
    assert response.json() == {"queue": ["Unknown queue 'never'; expected one of: default, extra, low."]}


def test_enqueue_uses_the_task_types_own_queue(api, inspector):
    response = enqueue(api, name="tests.testapp.api_tasks.low", args=[1])
    assert response.status_code == 201
    assert response.json()["queue"] == "low"


@pytest.mark.parametrize(
    "name", ["tests.testapp.api_tasks.hidden", "tests.testapp.api_tasks.nope", "os.system"]
)
def test_unknown_and_unexposed_task_types_get_the_same_404(api, name):
    response = enqueue(api, name=name, args=[1])
    assert response.status_code == 404
    assert response.json() == {"detail": f"No task type named {name!r} is exposed."}


@pytest.mark.parametrize(
    ("name", "body", "errors"),
    [
        (GREET, {}, {"kwargs": {"name": ["missing required argument"]}}),
        (GREET, {"args": ["a", 1, 2]}, {"args": ["At most 2 positional argument(s) allowed, 3 given."]}),
        (
            GREET,
            {"args": ["a"], "kwargs": {"colour": "red"}},
            {"kwargs": {"colour": ["unexpected argument"]}},
        ),
        (GREET, {"args": ["a"], "kwargs": {"name": "b"}}, {"kwargs": {"name": ["given in args as well"]}}),
        (
            "tests.testapp.api_tasks.positional_only",
            {"kwargs": {"a": 1}},
            {
                "args": ["Missing required positional argument 'a'."],
                "kwargs": {"a": ["positional-only argument: pass it in args"]},
            },
        ),
        (
            "tests.testapp.api_tasks.keyword_only",
            {"args": ["x"]},
            {
                "args": ["At most 0 positional argument(s) allowed, 1 given."],
                "kwargs": {"subject": ["missing required argument"]},
            },
        ),
    ],
)
def test_arguments_are_checked_against_the_signature(api, inspector, name, body, errors):
    response = enqueue(api, name=name, **body)
    assert response.status_code == 400
    assert response.json() == errors
    assert inspector.queue_stats("default").pending == 0


def test_a_function_taking_anything_takes_anything(api):
    response = enqueue(api, name="tests.testapp.api_tasks.anything", args=[1, [2]], kwargs={"x": {"y": None}})
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"args": "ada"}, "args"),
        ({"args": ["ada"], "kwargs": ["count"]}, "kwargs"),
        ({"args": ["ada"], "queue": "nope"}, "queue"),
        ({"args": ["ada"], "queue": "a{b}"}, "queue"),
        ({"args": ["ada"], "priority": 101}, "priority"),
        ({"args": ["ada"], "priority": "high"}, "priority"),
        ({"args": ["ada"], "delay": -1}, "delay"),
        ({"args": ["ada"], "task_id": "has space"}, "task_id"),
        ({"args": ["ada"], "task_id": "x" * 256}, "task_id"),
    ],
)
def test_bad_options_name_the_field(api, body, field):
    response = enqueue(api, **body)
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_the_body_must_be_a_json_object(api):
    url = f"{API}task-types/{GREET}/enqueue/"
    assert api.post(url, "[1]", content_type="application/json").status_code == 400
    assert api.post(url, "{nope", content_type="application/json").status_code == 400
    assert api.post(url, '{"args": [NaN]}', content_type="application/json").status_code == 400
    assert api.post(url, "name=ada", content_type="application/x-www-form-urlencoded").status_code == 415


def test_an_existing_task_id_is_a_conflict(api):
    assert enqueue(api, args=["ada"], task_id="same").status_code == 201
    response = enqueue(api, args=["bob"], task_id="same")
    assert response.status_code == 409
    assert "same" in response.json()["detail"]


def test_a_duplicate_unique_task_is_a_conflict(api):
    name = "tests.testapp.api_tasks.once"
    assert enqueue(api, name=name, args=["k"]).status_code == 201
    assert enqueue(api, name=name, args=["k"]).status_code == 409
    assert enqueue(api, name=name, args=["other"]).status_code == 201


# One task


def test_a_task_shows_its_state_and_result(api, run_worker):
    task_id = enqueue(api, args=["ada"], kwargs={"count": 2}).json()["id"]
    body = api.get(f"{API}tasks/{task_id}/").json()
    assert body["state"] == "pending"
    assert body["live"] is True
    assert (body["task"], body["args"], body["kwargs"]) == (GREET, ["ada"], {"count": 2})
    assert body["result"] is None

    with run_worker():
        body = wait_for(lambda: (b := api.get(f"{API}tasks/{task_id}/").json())["state"] == "completed" and b)
    assert body["result"] == "hello ada hello ada"
    assert body["finished_at"] is not None
    assert body["error"] is None


def test_a_failed_task_shows_its_errors(api, run_worker):
    message = tasks.always_fails.using(max_retries=0).enqueue("api-fails")
    with run_worker():
        body = wait_for(
            lambda: (b := api.get(f"{API}tasks/{message.id}/").json())["state"] == "archived" and b
        )
    assert body["error"] == "this task always fails"
    assert body["error_type"] == "builtins.ValueError"
    assert "ValueError" in body["traceback"]


def test_a_task_shows_its_progress(api, broker, redis_client):
    task_id = enqueue(api, args=["ada"]).json()["id"]
    assert api.get(f"{API}tasks/{task_id}/").json()["progress"] is None
    redis_client.hset(
        broker.queue("default").info, task_id, json.dumps({"progress": {"done": 3, "total": 9}})
    )
    assert api.get(f"{API}tasks/{task_id}/").json()["progress"] == {"done": 3, "total": 9}


def test_a_finished_task_is_found_in_the_orm(api):
    now = datetime.now(UTC)
    FinishedTask.objects.create(
        task_id="gone",
        task_name=GREET,
        queue="default",
        status=FinishedTask.Status.FAILED,
        args=["ada"],
        error_class="builtins.ValueError",
        error_message="boom",
        errors=[{"type": "builtins.ValueError", "message": "boom", "traceback": "..."}],
        attempts=3,
        finished_at=now,
    )
    body = api.get(f"{API}tasks/gone/").json()
    assert body["live"] is False
    assert (body["state"], body["error"], body["retried"]) == ("archived", "boom", 2)
    assert body["errors"][0]["message"] == "boom"
    assert api.get(f"{API}tasks/gone/?queue=low").status_code == 404


def test_an_unknown_task_is_404(api):
    response = api.get(f"{API}tasks/no-such-task/")
    assert response.status_code == 404
    assert response.json() == {"detail": "No task with id 'no-such-task'."}
    for action in ("run", "archive", "delete", "cancel"):
        assert api.post(f"{API}tasks/no-such-task/{action}/").status_code == 404


def test_a_task_can_be_looked_for_in_one_queue(api):
    task_id = enqueue(api, args=["ada"]).json()["id"]
    assert api.get(f"{API}tasks/{task_id}/?queue=default").status_code == 200
    assert api.get(f"{API}tasks/{task_id}/?queue=low").status_code == 404


# Actions on a task


def test_run_now_moves_a_scheduled_task_to_pending(api, inspector):
    task_id = enqueue(api, args=["ada"], delay=3600).json()["id"]
    response = api.post(f"{API}tasks/{task_id}/run/")
    assert response.status_code == 200
    assert response.json()["state"] == "pending"
    assert task_state(inspector, task_id) == TaskState.PENDING

    response = api.post(f"{API}tasks/{task_id}/run/")
    assert response.status_code == 409
    assert "pending" in response.json()["detail"]


def test_archive_then_run_an_archived_task(api, inspector):
    task_id = enqueue(api, args=["ada"]).json()["id"]
    assert api.post(f"{API}tasks/{task_id}/archive/").json()["state"] == "archived"
    assert task_state(inspector, task_id) == TaskState.ARCHIVED
    assert api.post(f"{API}tasks/{task_id}/archive/").status_code == 409
    assert api.post(f"{API}tasks/{task_id}/run/").json()["state"] == "pending"


def test_delete_removes_a_task(api, inspector):
    task_id = enqueue(api, args=["ada"]).json()["id"]
    response = api.post(f"{API}tasks/{task_id}/delete/")
    assert response.status_code == 204
    assert api.get(f"{API}tasks/{task_id}/").status_code == 404
    assert api.post(f"{API}tasks/{task_id}/delete/").status_code == 404


def test_actions_on_an_active_task(api, inspector, run_worker, redis_client):
    pending_id = enqueue(api, args=["ada"]).json()["id"]
    assert api.post(f"{API}tasks/{pending_id}/cancel/").status_code == 409

    message = tasks.block.using(queue="low").enqueue("api-cancel")
    with run_worker(concurrency=1, queues={"low": 1}) as worker:
        wait_for(worker.subscriber.subscribed.is_set)
        wait_for(lambda: redis_client.lrange(report_key("api-cancel:started"), 0, -1))
        for action in ("run", "archive", "delete"):
            response = api.post(f"{API}tasks/{message.id}/{action}/")
            assert response.status_code == 409, action
            assert "is active" in response.json()["detail"]
        response = api.post(f"{API}tasks/{message.id}/cancel/")
        assert response.status_code == 202
        assert response.json()["listeners"] >= 1
        wait_for(lambda: task_state(inspector, message.id) == TaskState.ARCHIVED)
    assert task_state(inspector, pending_id) == TaskState.PENDING


def test_cancel_without_a_listening_worker_is_a_conflict(api, inspector, broker, redis_client):
    task_id = enqueue(api, args=["ada"]).json()["id"]
    qk = broker.queue("default")
    # Make it look active without a worker: as `claim` would, with nobody subscribed to cancels.
    redis_client.zrem(qk.pending, task_id)
    redis_client.zadd(qk.active, {task_id: broker.now_ms() + 60_000})
    redis_client.hset(qk.state, task_id, "active")
    response = api.post(f"{API}tasks/{task_id}/cancel/")
    assert response.status_code == 409
    assert "No worker is listening" in response.json()["detail"]


def test_a_waiting_workflow_shows_its_progress_and_can_be_cancelled_or_deleted(api, inspector):
    from django_rtq.workflows import group
    from tests.testapp.wf_tasks import mark

    first = group(mark.s("api-wf", 1), mark.s("api-wf", 2)).enqueue()
    data = api.get(f"{API}tasks/{first}/").json()
    assert data["state"] == "waiting" and data["progress"] == {"done": 0, "total": 2}
    assert api.post(f"{API}tasks/{first}/cancel/").status_code == 202
    assert task_state(inspector, first) == TaskState.ARCHIVED

    second = group(mark.s("api-wf", 3)).enqueue()
    assert api.post(f"{API}tasks/{second}/delete/").status_code == 204
    assert api.get(f"{API}tasks/{second}/").status_code == 404


def test_running_a_finished_workflow_again_is_a_conflict(api, inspector):
    from django_rtq.workflows import group
    from tests.testapp.wf_tasks import mark

    workflow_id = group(mark.s("api-wf", 4)).enqueue()
    assert api.post(f"{API}tasks/{workflow_id}/cancel/").status_code == 202

    response = api.post(f"{API}tasks/{workflow_id}/run/")

    assert response.status_code == 409
    assert "a finished workflow cannot be run again" in response.json()["detail"]
    assert task_state(inspector, workflow_id) == TaskState.ARCHIVED


# Queues


def test_queues_list_their_stats(api, inspector):
    enqueue(api, args=["ada"])
    enqueue(api, args=["bob"], delay=60)
    response = api.get(f"{API}queues/")
    assert response.status_code == 200
    by_name = {item["queue"]: item for item in response.json()}
    assert set(by_name) == {"default", "low"}  # configured, and enqueued to
    assert by_name["default"]["pending"] == 1
    assert by_name["default"]["scheduled"] == 1
    assert by_name["default"]["size"] == 2
    assert by_name["default"]["paused"] is False
    assert by_name["low"]["size"] == 0


def test_a_queue_shows_its_stats_and_history(api):
    enqueue(api, args=["ada"])
    response = api.get(f"{API}queues/default/?days=3")
    assert response.status_code == 200
    body = response.json()
    assert body["pending"] == 1
    assert [set(day) for day in body["history"]] == [{"day", "processed", "failed"}] * 3
    assert api.get(f"{API}queues/default/?days=0").status_code == 400
    assert api.get(f"{API}queues/nope/").status_code == 404


def test_pause_and_resume_a_queue(api, inspector):
    response = api.post(f"{API}queues/default/pause/")
    assert response.status_code == 200
    assert response.json()["paused"] is True
    assert inspector.queue_stats("default").paused
    response = api.post(f"{API}queues/default/resume/")
    assert response.json()["paused"] is False
    assert not inspector.queue_stats("default").paused
    assert api.post(f"{API}queues/nope/pause/").status_code == 404
    assert api.post(f"{API}queues/nope/resume/").status_code == 404


def test_a_queues_tasks_come_in_pages(api):
    ids = [enqueue(api, args=[f"n{i}"]).json()["id"] for i in range(7)]
    url = f"{API}queues/default/tasks/?state=pending&limit=3"
    page = api.get(url).json()
    assert (page["count"], page["limit"], page["offset"]) == (7, 3, 0)
    assert [task["id"] for task in page["results"]] == ids[:3]
    assert page["previous"] is None
    page = api.get(page["next"]).json()
    assert [task["id"] for task in page["results"]] == ids[3:6]
    page = api.get(page["next"]).json()
    assert [task["id"] for task in page["results"]] == ids[6:]
    assert page["next"] is None
    assert "offset=3" in page["previous"]
    page = api.get(f"{url}&offset=100").json()
    assert (page["count"], page["results"]) == (7, [])
    assert api.get(f"{API}queues/default/tasks/?state=scheduled").json()["count"] == 0


def test_the_page_size_defaults_to_the_setting(api, settings):
    for i in range(3):
        enqueue(api, args=[f"n{i}"])
    settings.RTQ = {**settings.RTQ, "API_PAGE_SIZE": 2}
    page = api.get(f"{API}queues/default/tasks/?state=pending").json()
    assert (page["count"], page["limit"], len(page["results"])) == (3, 2, 2)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("", "state"),
        ("state=sleeping", "state"),
        ("state=pending&limit=0", "limit"),
        ("state=pending&limit=501", "limit"),
        ("state=pending&offset=-1", "offset"),
        ("state=pending&limit=x", "limit"),
    ],
)
def test_a_bad_task_list_query_names_the_field(api, query, field):
    response = api.get(f"{API}queues/default/tasks/?{query}")
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_the_tasks_of_an_unknown_queue_are_404(api):
    assert api.get(f"{API}queues/nope/tasks/?state=pending").status_code == 404


# Actions on whole states


def start_bulk(api: APIClient, queue: str = "default", **body):
    return api.post(f"{API}queues/{queue}/bulk/", body, format="json")


def test_a_bulk_action_answers_202_with_the_job_and_where_to_follow_it(api, broker, inspector):
    ids = make_tasks(broker, TaskState.SCHEDULED, "default", count=3)
    response = start_bulk(api, action="run", state="scheduled")
    assert response.status_code == 202, response.content
    job = response.json()
    assert response["Location"] == job["url"] == f"http://testserver{API}queues/default/bulk/{job['id']}/"
    assert (job["queue"], job["action"], job["states"]) == ("default", "run", ["scheduled"])
    assert (job["done"], job["skipped"], job["total"], job["percent"]) == (3, 0, 3, 100)
    assert job["finished"] is True and job["current_state"] is None
    assert job["started_by"] == "admin"
    assert job["started_at"] is not None and job["finished_at"] is not None
    assert [task_state(inspector, task_id) for task_id in ids] == [TaskState.PENDING] * 3
    assert api.get(job["url"]).json() == job


def test_a_bulk_job_left_unfinished_by_its_request_is_carried_on(api, broker, inspector, monkeypatch):
    ids = make_tasks(broker, TaskState.PENDING, "default", count=5)
    monkeypatch.setattr(operations, "REQUEST_BUDGET", 0)  # one page, then answer
    monkeypatch.setattr(bulk, "PAGE", 2)
    started = start_bulk(api, action="archive", state="pending").json()
    assert (started["done"], started["total"], started["percent"]) == (2, 5, 40)
    assert started["finished"] is False and started["finished_at"] is None
    assert started["current_state"] == "pending"
    assert api.get(started["url"]).json() == started
    assert inspector.count("default", TaskState.PENDING) == 3

    Operations().carry_on("default", started["id"], budget=10)  # as a worker's bulk runner does

    job = api.get(started["url"]).json()
    assert (job["done"], job["percent"], job["finished"]) == (5, 100, True)
    assert job["finished_at"] is not None
    assert [task_state(inspector, task_id) for task_id in ids] == [TaskState.ARCHIVED] * 5


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        (
            {"action": "archive", "state": "active"},
            {"state": ["archive applies to pending, scheduled, retry tasks, not active."]},
        ),
        (
            {"action": "run", "state": "pending"},
            {"state": ["run applies to scheduled, retry, archived tasks, not pending."]},
        ),
        (
            {"action": "cancel", "state": "active"},
            {
                "action": [
                    '"cancel" is no action on a whole state: expected one of run, archive, delete '
                    "(cancel is by task only)."
                ]
            },
        ),
        ({"action": "delete", "state": "sleeping"}, {"state": ['"sleeping" is not a valid choice.']}),
        ({}, {"action": ["This field is required."], "state": ["This field is required."]}),
    ],
)
def test_a_bulk_action_the_table_refuses_is_a_400_naming_why(api, broker, body, errors):
    make_tasks(broker, TaskState.PENDING, "default")
    response = api.post(f"{API}queues/default/bulk/", body, format="json")
    assert response.status_code == 400
    assert response.json() == errors
    assert Operations().bulk_jobs() == []


def test_purge_deletes_every_task_of_a_queue_but_the_active_ones(api, broker, inspector):
    [active] = make_tasks(broker, TaskState.ACTIVE, "default")
    gone = [
        *make_tasks(broker, TaskState.ARCHIVED, "default"),
        *make_tasks(broker, TaskState.SCHEDULED, "default", count=2),
        *make_tasks(broker, TaskState.PENDING, "default", count=3),
    ]
    [other] = make_tasks(broker, TaskState.PENDING, "low")
    response = api.post(f"{API}queues/default/purge/")
    assert response.status_code == 202, response.content
    job = response.json()
    assert response["Location"] == job["url"]
    assert (job["action"], job["states"]) == ("delete", list(PURGE_STATES))
    assert (job["done"], job["finished"]) == (6, True)
    for task_id in gone:
        assert api.get(f"{API}tasks/{task_id}/").status_code == 404
    assert task_state(inspector, active) == TaskState.ACTIVE
    assert task_state(inspector, other) == TaskState.PENDING


def test_bulk_routes_of_an_unknown_queue_or_job_are_404(api):
    response = start_bulk(api, queue="nope", action="run", state="retry")
    assert response.status_code == 404
    assert response.json() == {"detail": "Unknown queue 'nope'. Known queues: default, low."}
    assert api.post(f"{API}queues/nope/purge/").status_code == 404
    assert api.get(f"{API}queues/nope/bulk/0123abcd/").status_code == 404
    response = api.get(f"{API}queues/default/bulk/0123abcd/")
    assert response.status_code == 404
    assert "0123abcd" in response.json()["detail"]


# Workers


def test_workers_are_listed(api, run_worker):
    assert api.get(f"{API}workers/").json() == []
    with run_worker(queues={"default": 2}) as worker:
        workers = wait_for(lambda: api.get(f"{API}workers/").json())
    assert [w["id"] for w in workers] == [worker.id]
    assert workers[0]["queues"] == {"default": 2}
    assert workers[0]["active"] == []
    assert workers[0]["settings"] == "tests.settings"
    assert len(workers[0]["project"]) == 12


# Finished tasks


@pytest.fixture
def finished_rows(db):
    base = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        ("t1", GREET, "default", "succeeded", base),
        ("t2", GREET, "low", "failed", base + timedelta(hours=1)),
        ("t3", "other.task", "default", "failed", base + timedelta(hours=2)),
        ("t4", "other.task", "default", "succeeded", base + timedelta(hours=3)),
    ]
    FinishedTask.objects.bulk_create(
        FinishedTask(task_id=i, task_name=name, queue=queue, status=status, finished_at=at)
        for i, name, queue, status, at in rows
    )
    return rows


@pytest.mark.parametrize(
    ("query", "ids"),
    [
        ("", ["t4", "t3", "t2", "t1"]),
        ("status=failed", ["t3", "t2"]),
        ("queue=default", ["t4", "t3", "t1"]),
        ("task_name=other.task", ["t4", "t3"]),
        ("finished_after=2026-01-01T01:00:00Z", ["t4", "t3", "t2"]),
        ("finished_before=2026-01-01T02:00:00Z", ["t2", "t1"]),
        ("status=succeeded&queue=default&finished_after=2026-01-01T00:30:00Z", ["t4"]),
    ],
)
def test_finished_tasks_can_be_filtered(api, finished_rows, query, ids):
    response = api.get(f"{API}finished/?{query}")
    assert response.status_code == 200
    body = response.json()
    assert [row["task_id"] for row in body["results"]] == ids
    assert body["count"] == len(ids)


def test_finished_tasks_come_in_pages(api, finished_rows):
    page = api.get(f"{API}finished/?limit=3").json()
    assert [row["task_id"] for row in page["results"]] == ["t4", "t3", "t2"]
    assert page["next"].endswith("offset=3") or "offset=3" in page["next"]
    page = api.get(page["next"]).json()
    assert [row["task_id"] for row in page["results"]] == ["t1"]
    assert page["next"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [("status=lost", "status"), ("finished_after=yesterday", "finished_after"), ("limit=501", "limit")],
)
def test_a_bad_finished_query_names_the_field(api, query, field):
    response = api.get(f"{API}finished/?{query}")
    assert response.status_code == 400
    assert list(response.json()) == [field]


# The schema


def test_the_schema_describes_the_api(api):
    response = api.get(f"{API}schema/?format=json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["info"]["title"] == "django-rtq API"
    enqueue_op = schema["paths"][f"{API}task-types/{{name}}/enqueue/"]["post"]
    assert enqueue_op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "EnqueueRequest"
    )
    assert {"201", "400", "403", "404", "409"} <= set(enqueue_op["responses"])
    assert set(schema["paths"][f"{API}queues/{{queue}}/tasks/"]["get"]["responses"]) >= {"200", "400", "404"}
    bulk_op = schema["paths"][f"{API}queues/{{queue}}/bulk/"]["post"]
    assert {"202", "400", "404"} <= set(bulk_op["responses"])
    assert "Location" in bulk_op["responses"]["202"]["headers"]
    assert f"{API}queues/{{queue}}/bulk/{{job_id}}/" in schema["paths"]
    # One enum of task states, whichever field names them.
    components = schema["components"]["schemas"]
    task_state = {"$ref": "#/components/schemas/TaskStateEnum"}
    assert components["Task"]["properties"]["state"] == task_state
    assert components["BulkJob"]["properties"]["states"]["items"] == task_state
    assert components["BulkActionRequest"]["properties"]["state"]["allOf"] == [task_state]
    assert sorted(name for name in components if name.endswith("Enum")) == [
        "ActionEnum",
        "EnqueuedStateEnum",
        "StatusEnum",
        "TaskStateEnum",
        "WhyEnum",  # why tasks wait for a worker that can run them
    ]
    assert not any(path.endswith("schema/") for path in schema["paths"])


def test_the_schema_needs_the_same_access(prefix):
    assert APIClient().get(f"{API}schema/").status_code == 403


def test_exposed_is_read_from_the_decorator():
    assert api_tasks.greet.exposed
    assert not api_tasks.hidden.exposed

"""The API keeps its contract: JSON errors everywhere under its prefix, JSON bodies only, task ids."""

from __future__ import annotations

import base64
import http.client
import json

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from django_rtq.api.parsers import MAX_JSON_DEPTH
from django_rtq.broker import TaskState
from django_rtq.task_options import TASK_ID_RULE
from tests.support.factories import enqueue as broker_enqueue
from tests.support.factories import make_tasks
from tests.testapp import api_tasks  # noqa: F401 -- registers the exposed task types

pytestmark = pytest.mark.django_db

API = "/rtq/api/"
ENQUEUE = f"{API}task-types/tests.testapp.api_tasks.greet/enqueue/"
ACTIONS = ("run", "archive", "delete", "cancel")


@pytest.fixture
def api(prefix) -> APIClient:
    client = APIClient()
    client.force_authenticate(User(username="admin", is_staff=True, is_superuser=True))
    return client


def assert_json_error(response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:200])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body, dict) and body, body
    return body


# 1. Every response under the prefix is JSON


@pytest.mark.parametrize(
    "path",
    [
        "nope/",
        "nope",
        "tasks/",  # no id
        "tasks/x",  # no trailing slash
        "queues/a/b/",  # does not match the <str:queue> converter
        "queues/default/nope/",
        "task-types/x/y/enqueue/",
        "schema",
    ],
)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_unknown_paths_are_a_json_404(api, path, method):
    body = assert_json_error(getattr(api, method)(API + path), 404)
    assert "detail" in body


def test_unknown_paths_are_a_json_404_without_credentials(prefix):
    assert_json_error(APIClient().get(f"{API}nope/"), 404)


def test_paths_outside_the_prefix_are_left_to_the_project(prefix):
    response = Client().get("/nope/")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "tasks/x/run/"),
        ("put", "tasks/x/"),
        ("delete", "queues/default/"),
        ("get", ENQUEUE.removeprefix(API)),
        ("post", "schema/"),
        ("post", "workers/"),
    ],
)
def test_a_method_not_allowed_is_a_json_405(api, method, path):
    assert "detail" in assert_json_error(getattr(api, method)(API + path), 405)


def test_schema_errors_are_json_whatever_the_format(prefix):
    response = APIClient().get(f"{API}schema/")  # YAML by default, but this is an error
    assert_json_error(response, 403)


def test_access_errors_are_json(prefix, settings):
    assert_json_error(APIClient().post(f"{API}tasks/x/run/"), 403)
    settings.RTQ = {
        **settings.RTQ,
        "API_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    }
    assert_json_error(APIClient().get(f"{API}queues/"), 401)


# 2. Every POST is JSON


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("x=1", "application/x-www-form-urlencoded"),
        ("hello", "text/plain"),
    ],
)
def test_an_action_refuses_a_body_that_is_not_json(api, broker, action, body, content_type):
    [task_id] = make_tasks(broker, TaskState.SCHEDULED, "default")
    response = api.post(f"{API}tasks/{task_id}/{action}/", body, content_type=content_type)
    assert "detail" in assert_json_error(response, 415)
    assert api.get(f"{API}tasks/{task_id}/").json()["state"] == "scheduled"


def test_a_body_without_a_content_type_is_refused(api, broker):
    [task_id] = make_tasks(broker, TaskState.SCHEDULED, "default")
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    # The test client always sets a content type with a body; a raw WSGI request need not.
    response = client.generic("POST", f"{API}tasks/{task_id}/run/", b'{"a": 1}', content_type="")
    assert_json_error(response, 415)
    assert api.get(f"{API}tasks/{task_id}/").json()["state"] == "scheduled"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (None, None),  # curl -X POST: no body, no content type
        ("", "application/json"),
        ("{}", "application/json"),
        ("{}", "application/json; charset=utf-8"),
        ("", "text/plain"),  # what wsgiref (runserver) names when the client sends no type
        ("", "application/x-www-form-urlencoded"),  # curl -d ''
    ],
)
def test_an_action_takes_json_or_nothing(api, broker, body, content_type):
    [task_id] = make_tasks(broker, TaskState.SCHEDULED, "default")
    response = api.post(f"{API}tasks/{task_id}/run/", body, content_type=content_type)
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "pending"


@pytest.mark.django_db(transaction=True)
def test_curl_x_post_under_runserver_is_taken_as_an_empty_body(live_server, broker, settings):
    """The docs' `curl -X POST`, through the WSGI server `runserver` runs (wsgiref's request
    handler, which names `text/plain` when the client sends no content type)."""
    settings.RTQ = {
        **settings.RTQ,
        "API_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    }
    User.objects.create_superuser("root", "root@example.com", "pw")
    [task_id] = make_tasks(broker, TaskState.SCHEDULED, "default")
    host, port = live_server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    credentials = base64.b64encode(b"root:pw").decode()
    # What `curl -u root:pw -X POST URL` sends: no body, no Content-Type.
    connection.putrequest("POST", f"{API}tasks/{task_id}/run/", skip_accept_encoding=True)
    connection.putheader("Authorization", f"Basic {credentials}")
    connection.endheaders()
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    assert response.status == 200, body
    assert body["state"] == "pending"


def test_queue_actions_refuse_a_body_that_is_not_json(api):
    form = "application/x-www-form-urlencoded"
    response = api.post(f"{API}queues/default/pause/", "x=1", content_type=form)
    assert_json_error(response, 415)
    assert api.get(f"{API}queues/default/").json()["paused"] is False
    assert api.post(f"{API}queues/default/pause/").json()["paused"] is True


def test_enqueue_refuses_a_body_that_is_not_json(api, inspector):
    assert_json_error(api.post(ENQUEUE, '{"args": ["ada"]}', content_type="text/plain"), 415)
    assert inspector.count("default", TaskState.PENDING) == 0


# 3. Broken JSON is a 400


def nested(depth: int) -> str:
    return '{"args": [' + "[" * (depth - 2) + "]" * (depth - 2) + "]}"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 2_000, 100_000])
def test_a_body_nested_too_deeply_is_a_400(api, inspector, depth):
    response = api.post(ENQUEUE, nested(depth), content_type="application/json")
    assert "nested too deeply" in assert_json_error(response, 400)["detail"]
    assert inspector.count("default", TaskState.PENDING) == 0


def test_a_body_nested_up_to_the_limit_is_taken(api):
    response = api.post(ENQUEUE, nested(MAX_JSON_DEPTH), content_type="application/json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("body", ["{nope", '{"args": [NaN]}', b"\xff\xfe{", "[" * 2_000])
def test_undecodable_json_is_a_400_on_every_post(api, broker, body):
    [task_id] = make_tasks(broker, TaskState.SCHEDULED, "default")
    for url in (ENQUEUE, f"{API}tasks/{task_id}/run/", f"{API}queues/default/pause/"):
        assert "detail" in assert_json_error(api.post(url, body, content_type="application/json"), 400)
    assert api.get(f"{API}tasks/{task_id}/").json()["state"] == "scheduled"


# 4. Task ids


@pytest.mark.parametrize(
    "task_id", ["order/42", "a b", " x", "x\n", "50%", "a?b", "a#b", "a\\b", "é", "", "x" * 256]
)
def test_a_task_id_out_of_the_rule_is_a_400_naming_it(api, inspector, task_id):
    response = api.post(ENQUEUE, {"args": ["ada"], "task_id": task_id}, format="json")
    body = assert_json_error(response, 400)
    assert list(body) == ["task_id"]
    assert any(TASK_ID_RULE in message for message in body["task_id"]) or task_id == "", body
    assert inspector.count("default", TaskState.PENDING) == 0


def test_the_longest_task_id_is_taken(api):
    task_id = "x" * 255
    response = api.post(ENQUEUE, {"args": ["ada"], "task_id": task_id}, format="json")
    assert response.status_code == 201
    assert response["Location"].endswith(f"/tasks/{task_id}/")
    assert api.get(f"{API}tasks/{task_id}/").json()["id"] == task_id


def test_the_schema_states_the_task_id_rule(api):
    schema = api.get(f"{API}schema/?format=json").json()
    task_id = schema["components"]["schemas"]["EnqueueRequest"]["properties"]["task_id"]
    assert task_id["maxLength"] == 255
    assert "pattern" in task_id


LEGACY_IDS = ["reports/2026/x", "with space", "../../../auth/user/", "50%25", "..", "a?b#c"]


@pytest.mark.parametrize("task_id", LEGACY_IDS)
def test_odd_ids_stored_before_the_rule_stay_reachable_in_the_api(api, broker, task_id):
    broker_enqueue(broker, "default", id=task_id, process_at=broker.clock() + 60)
    url = reverse("rtq_api:task-detail", kwargs={"task_id": task_id})
    assert api.get(url).json()["id"] == task_id
    run = reverse("rtq_api:task-run", kwargs={"task_id": task_id})
    assert api.post(run).json()["state"] == "pending"
    delete = reverse("rtq_api:task-delete", kwargs={"task_id": task_id})
    assert api.post(delete).status_code == 204
    assert api.get(url).status_code == 404


@pytest.mark.parametrize("task_id", LEGACY_IDS)
def test_odd_ids_stay_reachable_in_the_admin_and_link_to_their_own_page(broker, task_id):
    broker_enqueue(broker, "default", id=task_id)
    broker_enqueue(broker, "default", id="plain")
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.get("/admin/django_rtq/livetask/tasks/pending/?queue=default")
    assert page.status_code == 200
    [link] = [row["url"] for row in page.context["rows"] if row["id"] == task_id]
    path = link.split("?")[0]
    # The link is one path segment under task/, which no browser resolves elsewhere.
    segment = path.removeprefix("/admin/django_rtq/livetask/task/").removesuffix("/")
    assert path.startswith("/admin/django_rtq/livetask/task/") and "/" not in segment, link
    assert segment not in (".", ".."), link
    assert f'href="{link}"' in page.text.replace("&amp;", "&")
    detail = client.get(link)
    assert detail.status_code == 200
    assert detail.context["task"].id == task_id


def test_a_plain_ids_admin_link_is_the_id_itself():
    # The quoting only touches odd ids.
    url = reverse("admin:django_rtq_task", args=["abc-123_x.y"])
    assert url == "/admin/django_rtq/livetask/task/abc-123_x.y/"

"""Who may do what: every API route and every admin live view, for every role, against a real Redis.

Each route is a row (method, URL, the permissions it needs, the status it answers when
allowed, what it changes). For each role the test expects the row's status and change when
the role has the permissions, else a refusal (403, or the login page / not authenticated for
anonymous users) that changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import resolve, reverse
from django.utils import timezone
from rest_framework.test import APIClient

from django_rtq import permissions as perms
from django_rtq.api.routes import api_urlpatterns
from django_rtq.api.urls import urlpatterns
from django_rtq.broker import TaskState
from django_rtq.broker.states import Action
from django_rtq.exceptions import TaskNotFound
from django_rtq.models import FinishedTask, LiveTask
from django_rtq.operations import Operations
from tests.support.factories import failed_call, make_tasks
from tests.testapp import api_tasks, tasks

pytestmark = pytest.mark.django_db

S = TaskState
Q = "emails"  # the tests' queue: tasks in every state the actions need
PAUSED = "low"  # a queue of settings.RTQ["QUEUES"], paused before each test
FINISHED = "finished-1"  # a task only in the ORM mirror
GREET = api_tasks.greet.name  # an exposed task type (importing the module registers it)
API = "/rtq/api/"
ADMIN = "/admin/django_rtq/livetask/"

VIEW, CHANGE, ENQUEUE, HISTORY = perms.VIEW_LIVE, perms.CHANGE_LIVE, perms.ENQUEUE, perms.VIEW_HISTORY
EDIT = perms.EDIT_ARGUMENTS
#: A row that any one of the API's permissions opens (the schema).
ANY = "any"

#: The roles: the permissions given to a staff user (the superuser has them all).
ROLES: dict[str, tuple[str, ...]] = {
    "staff": (),  # staff status, no permission of django-rtq
    "viewer": (VIEW, HISTORY),
    "operator": (VIEW, CHANGE),
    "enqueuer": (ENQUEUE,),
    "editor": (VIEW, EDIT),  # edits arguments, without the change permission
}
ALL_ROLES = ["anonymous", *ROLES, "superuser"]


def make_user(role: str, *, is_staff: bool = True, granted: tuple[str, ...] | None = None) -> User | None:
    if role == "anonymous":
        return None
    if role == "superuser":
        return User.objects.create_superuser("root", "root@example.com", None)  # no password: no hashing
    names = ROLES[role] if granted is None else granted
    user = User.objects.create_user(role, is_staff=is_staff)  # logged in by force, no password
    codenames = [name.split(".", 1)[1] for name in names]
    found = Permission.objects.filter(content_type__app_label="django_rtq", codename__in=codenames)
    assert sorted(p.codename for p in found) == sorted(codenames)  # each exists (migrations)
    user.user_permissions.add(*found)
    return user


def is_allowed(role: str, needs: frozenset[str] | str) -> bool:
    if role == "anonymous":
        return False
    if role == "superuser":
        return True
    granted = set(ROLES[role])
    if needs == ANY:
        return bool(granted)
    return bool(needs & granted) if isinstance(needs, AnyOf) else needs <= granted


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # formatted with the world's task ids (and, for the API, `names`)
    needs: frozenset[str] | str
    status: int  # when allowed
    data: dict[str, Any] | None = None
    effect: dict[str, Any] = field(default_factory=dict)  # what it changes in the snapshot when allowed

    def __str__(self) -> str:
        return f"{self.method} {self.path}" + (f" {self.data}" if self.data else "")


def needs(*names: str) -> frozenset[str]:
    """All of these permissions."""
    return frozenset(names)


class AnyOf(frozenset):
    """Any one of these permissions."""


@pytest.fixture
def world(broker, inspector) -> dict[str, str]:
    """Tasks in the states the actions apply to, a paused queue, a finished task in the ORM."""
    edited = failed_call(broker, tasks.divide.using(queue=Q), [1, 0])  # archived: its arguments to edit
    [archived] = make_tasks(broker, S.ARCHIVED, Q)  # first: it claims the queue's only pending task
    [waiting] = make_tasks(broker, S.WAITING, Q)
    [scheduled] = make_tasks(broker, S.SCHEDULED, Q)
    [pending] = make_tasks(broker, S.PENDING, Q)
    broker.pause(PAUSED)
    FinishedTask.objects.create(
        task_id=FINISHED, task_name=GREET, queue="default", status="succeeded", finished_at=timezone.now()
    )
    return {
        "archived": archived,
        "waiting": waiting,
        "scheduled": scheduled,
        "pending": pending,
        "edited": edited,
    }


def snapshot(inspector, world: dict[str, str]) -> dict[str, Any]:
    """What the routes can change: the tasks' states, which queues are paused, what was enqueued."""

    def state(task_id: str) -> str | None:
        try:
            return inspector.get_task(task_id).state
        except TaskNotFound:
            return None

    return {
        **{name: state(task_id) for name, task_id in world.items()},
        f"paused:{Q}": inspector.broker.is_paused(Q),
        f"paused:{PAUSED}": inspector.broker.is_paused(PAUSED),
        "enqueued": inspector.count("default", S.PENDING),
    }


# The API

API_ROUTES = [
    Route("GET", "task-types/", AnyOf({VIEW, ENQUEUE}), 200),  # an enqueuer sees what it may enqueue
    Route("POST", f"task-types/{GREET}/enqueue/", needs(ENQUEUE), 201, {"args": ["ada"]}, {"enqueued": 1}),
    Route("POST", "task-types/tests.testapp.api_tasks.hidden/enqueue/", needs(ENQUEUE), 404, {"args": [1]}),
    Route("GET", "tasks/{pending}/", needs(VIEW), 200),
    Route("GET", f"tasks/{FINISHED}/", needs(VIEW, HISTORY), 200),  # history, found by the task view
    Route("GET", "tasks/no-such-task/", needs(VIEW), 404),
    Route("POST", "tasks/{scheduled}/run/", needs(CHANGE), 200, effect={"scheduled": S.PENDING}),
    Route("POST", "tasks/{pending}/archive/", needs(CHANGE), 200, effect={"pending": S.ARCHIVED}),
    Route("POST", "tasks/{archived}/delete/", needs(CHANGE), 204, effect={"archived": None}),
    Route("POST", "tasks/{waiting}/cancel/", needs(CHANGE), 202, effect={"waiting": S.ARCHIVED}),
    Route("POST", "tasks/{pending}/run/", needs(CHANGE), 409),  # a pending task cannot run "now"
    Route("POST", "tasks/{edited}/edit/", needs(EDIT), 200, {"args": [4, 2]}, {"edited": S.PENDING}),
    Route("POST", "tasks/{pending}/edit/", needs(EDIT), 409, {"args": [4, 2]}),  # only retry or archived
    Route("GET", "tasks/{edited}/edits/", AnyOf({VIEW, HISTORY}), 200),
    Route("GET", "queues/", needs(VIEW), 200),
    Route("GET", f"queues/{Q}/", needs(VIEW), 200),
    Route("GET", "queues/no-such-queue/", needs(VIEW), 404),
    Route("POST", f"queues/{Q}/pause/", needs(CHANGE), 200, effect={f"paused:{Q}": True}),
    Route("POST", f"queues/{PAUSED}/resume/", needs(CHANGE), 200, effect={f"paused:{PAUSED}": False}),
    Route("GET", f"queues/{Q}/tasks/?state=pending", needs(VIEW), 200),
    Route(
        "POST",
        f"queues/{Q}/bulk/",
        needs(CHANGE),
        202,
        {"action": "run", "state": "scheduled"},
        {"scheduled": S.PENDING},
    ),
    Route("POST", f"queues/{Q}/bulk/", needs(CHANGE), 400, {"action": "run", "state": "pending"}),
    Route("POST", "queues/no-such-queue/bulk/", needs(CHANGE), 404, {"action": "run", "state": "retry"}),
    Route("GET", f"queues/{Q}/bulk/{{job}}/", needs(VIEW), 200),
    Route("GET", f"queues/{Q}/bulk/no-such-job/", needs(VIEW), 404),
    Route(
        "POST",
        f"queues/{Q}/purge/",
        needs(CHANGE),
        202,
        effect={"archived": None, "waiting": None, "scheduled": None, "pending": None, "edited": None},
    ),
    Route("GET", "outbox/", needs(VIEW), 200),
    Route("GET", "workers/", needs(VIEW), 200),
    Route("GET", "finished/", needs(HISTORY), 200),
    Route("GET", "schema/?format=json", ANY, 200),
]


def api_client(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def names(world) -> dict[str, str]:
    """What the API routes' paths name: the world's tasks, and a bulk job on its queue."""
    job = Operations().start_bulk(Action.ARCHIVE, Q, [S.RETRY])  # no retry tasks: done at once
    return {**world, "job": job.id}


def bulk_jobs() -> set[str]:
    return {job.id for job in Operations().bulk_jobs()}


def call_api(client: APIClient, route: Route, names: dict[str, str]):
    url = API + route.path.format(**names)
    if route.method == "GET":
        return client.get(url)
    return client.post(url, route.data, format="json")


@pytest.mark.parametrize("role", ALL_ROLES)
@pytest.mark.parametrize("route", API_ROUTES, ids=str)
def test_api_route_by_role(route, role, world, names, inspector):
    client = api_client(make_user(role))
    before, jobs_before = snapshot(inspector, world), bulk_jobs()

    response = call_api(client, route, names)

    if is_allowed(role, route.needs):
        assert response.status_code == route.status, response.content
        assert snapshot(inspector, world) == {**before, **route.effect}
        starts_a_job = route.status == 202 and route.path.endswith(("/bulk/", "/purge/"))
        assert len(bulk_jobs() - jobs_before) == starts_a_job
    else:
        assert response.status_code == 403, response.content
        detail = response.json()["detail"]
        if role == "anonymous":  # DRF's default authentication: session first, so 403, not 401
            assert detail == "Authentication credentials were not provided."
        else:
            assert "You do not have permission to perform this action: it needs" in detail
        assert snapshot(inspector, world) == before
        assert bulk_jobs() == jobs_before


def test_anonymous_requests_get_401_on_every_route_with_basic_authentication(
    world, names, inspector, settings
):
    settings.RTQ = {
        **settings.RTQ,
        "API_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"],
    }
    before = snapshot(inspector, world)
    for route in API_ROUTES:
        response = call_api(APIClient(), route, names)
        assert response.status_code == 401, route
        assert response["WWW-Authenticate"].startswith("Basic"), route
    assert snapshot(inspector, world) == before


def test_every_api_route_is_in_the_matrix_and_names_its_permission():
    assert urlpatterns[-1].name == "not-found"  # the JSON 404 for anything else, open to all
    routes = urlpatterns[:-1]
    named = {pattern.name for pattern in routes}
    tested = {resolve((API + route.path).split("?")[0]).url_name for route in API_ROUTES}
    assert tested == named
    for pattern in routes:
        required = pattern.callback.view_class.required_permission
        assert required, pattern.name
        names = (required,) if isinstance(required, str) else required
        assert set(names) <= set(perms.API_PERMISSIONS), pattern.name
    assert len(api_urlpatterns) == len(routes) - 1  # the schema is the only other


def test_refusals_name_the_missing_permission(world):
    client = api_client(make_user("operator"))  # live tasks, not their history
    response = client.get(f"{API}tasks/{FINISHED}/")
    assert response.status_code == 403
    assert response.json()["detail"].endswith("it needs django_rtq.view_finishedtask.")
    assert client.get(f"{API}tasks/{world['pending']}/").status_code == 200  # a live task is fine

    client = api_client(make_user("enqueuer"))
    response = client.post(f"{API}tasks/{world['scheduled']}/run/")
    assert response.json()["detail"].endswith("it needs django_rtq.change_livetask.")


def test_the_change_permission_includes_viewing_in_the_api_and_the_admin(world):
    user = make_user("changer", granted=(CHANGE,))
    client = api_client(user)
    assert client.get(f"{API}queues/").status_code == 200
    assert client.get(f"{API}tasks/{world['pending']}/").status_code == 200
    assert client.get(f"{API}finished/").status_code == 403  # history is not live tasks
    assert client.get(f"{API}tasks/{FINISHED}/").status_code == 403
    admin = Client()
    admin.force_login(user)
    assert admin.get(ADMIN).status_code == 200


def test_a_user_who_is_not_staff_may_use_the_api_with_the_permissions_but_not_the_admin(world):
    user = make_user("service", is_staff=False, granted=(VIEW, ENQUEUE))
    client = api_client(user)
    assert client.get(f"{API}queues/").status_code == 200
    assert client.post(f"{API}task-types/{GREET}/enqueue/", {"args": ["x"]}, format="json").status_code == 201
    assert client.post(f"{API}queues/{Q}/pause/").status_code == 403
    admin = Client()
    admin.force_login(user)
    assert admin.get(ADMIN)["Location"].startswith("/admin/login/")


def test_an_inactive_superuser_is_refused(world):
    user = make_user("superuser")
    user.is_active = False
    assert api_client(user).get(f"{API}queues/").status_code == 403


def test_the_permission_classes_setting_replaces_the_rule(world, inspector, settings):
    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"]}
    client = api_client(make_user("staff"))
    assert client.get(f"{API}finished/").status_code == 200
    assert client.get(f"{API}tasks/{FINISHED}/").status_code == 200  # no object check of ours either
    assert client.post(f"{API}tasks/{world['scheduled']}/run/").status_code == 200
    assert inspector.get_task(world["scheduled"]).state == S.PENDING
    assert APIClient().get(f"{API}queues/").status_code == 403

    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": ["django_rtq.api.permissions.RTQPermissions"]}
    assert client.get(f"{API}finished/").status_code == 403


def test_the_enqueue_permission_is_created_by_the_migrations():
    permission = Permission.objects.get(content_type__app_label="django_rtq", codename="enqueue_task")
    assert permission.name == "Can enqueue tasks through the API"
    assert permission.content_type.model == "livetask"


# The admin


def admin_task_url(task_id: str) -> str:
    return reverse("admin:django_rtq_task", args=[task_id]) + f"?queue={Q}"


ACTION = ADMIN + "actions/tasks/"
QUEUE_ACTION = ADMIN + "actions/queue/"


def run_data(**extra: str) -> dict[str, str]:
    return {"action": "run", "queue": Q, "state": "scheduled", "ids": "{scheduled}", **extra}


ADMIN_ROUTES = [
    Route("GET", ADMIN, needs(VIEW), 200),
    Route("GET", ADMIN + f"tasks/archived/?queue={Q}", needs(VIEW), 200),
    Route("GET", ADMIN + "workers/", needs(VIEW), 200),
    Route("GET", ADMIN + "periodic/", needs(VIEW), 200),
    Route("GET", ADMIN + "outbox/", needs(VIEW), 200),
    Route("POST", ADMIN + "actions/outbox/", needs(CHANGE), 200, {"ids": "order-1"}),  # the confirmation page
    Route("GET", "task:{archived}", needs(VIEW), 200),
    Route("GET", "task:no-such-task", needs(VIEW), 404),
    Route("GET", ADMIN + f"task/{{edited}}/edit/?queue={Q}", needs(VIEW, EDIT), 200),
    Route(
        "POST",
        ADMIN + "task/{edited}/edit/",
        needs(VIEW, EDIT),
        302,
        {"queue": Q, "args": "[4, 2]", "kwargs": "", "confirm": "yes"},
        {"edited": S.PENDING},
    ),
    Route("POST", ACTION, needs(CHANGE), 200, run_data()),  # the confirmation page
    Route("POST", ACTION, needs(CHANGE), 302, run_data(confirm="yes"), {"scheduled": S.PENDING}),
    Route(
        "POST",
        ACTION,
        needs(CHANGE),
        302,
        {"action": "delete", "queue": Q, "state": "archived", "ids": "{archived}", "confirm": "yes"},
        {"archived": None},
    ),
    Route(
        "POST",
        ACTION,
        needs(CHANGE),
        302,
        {"action": "cancel", "queue": Q, "state": "waiting", "ids": "{waiting}", "confirm": "yes"},
        {"waiting": S.ARCHIVED},
    ),
    Route("POST", QUEUE_ACTION, needs(CHANGE), 200, {"queue": Q, "action": "pause"}),
    Route(
        "POST",
        QUEUE_ACTION,
        needs(CHANGE),
        302,
        {"queue": Q, "action": "pause", "confirm": "yes"},
        {f"paused:{Q}": True},
    ),
    Route(
        "POST",
        QUEUE_ACTION,
        needs(CHANGE),
        302,
        {"queue": PAUSED, "action": "resume", "confirm": "yes"},
        {f"paused:{PAUSED}": False},
    ),
    Route(
        "POST",
        ACTION,
        needs(CHANGE),
        302,  # to the progress page of the bulk job it started
        {"action": "run", "queue": Q, "state": "scheduled", "scope": "all", "confirm": "yes"},
        {"scheduled": S.PENDING},
    ),
    Route("POST", QUEUE_ACTION, needs(CHANGE), 200, {"queue": Q, "action": "purge"}),
    Route(
        "POST",
        QUEUE_ACTION,
        needs(CHANGE),
        302,
        {"queue": Q, "action": "purge", "confirm": "yes"},
        {"archived": None, "waiting": None, "scheduled": None, "pending": None, "edited": None},
    ),
    Route("GET", ADMIN + f"bulk/{Q}/{{job}}/", needs(VIEW), 200),
    Route("GET", ADMIN + f"bulk/{Q}/no-such-job/", needs(VIEW), 404),
    Route("POST", ADMIN + f"bulk/{Q}/{{job}}/carry-on/", needs(CHANGE), 302),
    Route("GET", "/admin/django_rtq/finishedtask/", needs(HISTORY), 200),
    Route("GET", f"/admin/django_rtq/finishedtask/{FINISHED}/change/", needs(HISTORY), 200),
]


@pytest.mark.parametrize("role", ALL_ROLES)
@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=str)
def test_admin_view_by_role(route, role, world, names, inspector):
    client = Client()
    user = make_user(role)
    if user is not None:
        client.force_login(user)
    path = route.path.format(**names)
    url = admin_task_url(path.removeprefix("task:")) if path.startswith("task:") else path
    before = snapshot(inspector, world)

    if route.method == "GET":
        response = client.get(url)
    else:
        response = client.post(url, {key: value.format(**names) for key, value in (route.data or {}).items()})

    if role == "anonymous":
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")
        assert snapshot(inspector, world) == before
    elif is_allowed(role, route.needs):
        assert response.status_code == route.status, response.content
        if route.status == 302:  # done, and back to where it came from
            assert not response["Location"].startswith("/admin/login/")
        assert snapshot(inspector, world) == {**before, **route.effect}
    else:
        assert response.status_code == 403
        assert snapshot(inspector, world) == before


def test_every_admin_live_view_is_in_the_matrix():
    live_admin = admin.site.get_model_admin(LiveTask)
    named = {pattern.name for pattern in live_admin.get_urls()}
    tested = {
        resolve(
            (admin_task_url("x") if route.path.startswith("task:") else route.path).split("?")[0]
        ).url_name
        for route in ADMIN_ROUTES
        if route.path.startswith((ADMIN, "task:"))
    }
    assert tested == named


def test_the_admin_index_shows_each_role_what_it_may_see(world):
    shown = {}
    for role in ROLES:
        client = Client()
        client.force_login(make_user(role))
        index = client.get("/admin/").text
        shown[role] = ("Live tasks" in index, "Finished tasks" in index)
    assert shown == {
        "staff": (False, False),
        "viewer": (True, True),
        "operator": (True, False),
        "enqueuer": (False, False),  # enqueueing is the API's alone
        "editor": (True, False),
    }

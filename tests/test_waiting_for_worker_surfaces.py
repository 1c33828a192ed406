"""Tasks that wait for a worker able to run them made visible: each kind (task type and why), how
many wait and since when, read through the operations layer by the admin, the API, `rtq_stats`
and the metrics, with the view permission of live state; nothing shown when none wait."""

from __future__ import annotations

import html
import io
import json
import re
import time
from datetime import datetime

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from django_rtq.broker import Broker
from django_rtq.broker.waiting import NEWER_FORMAT, UNKNOWN_TYPE
from django_rtq.operations import Operations
from tests.support.factories import enqueue
from tests.support.users import logged_in, user_with
from tests.support.waiting import UNKNOWN_TASK, park

pytestmark = pytest.mark.django_db

Q, OTHER_Q = "emails", "low"
NEWER = "tests.surfaces.newer"  # sorts after UNKNOWN_TASK
NEWER_REASON = f"task {NEWER!r} is stored in format 9, newer than this release reads (2)"


@pytest.fixture
def parked(broker: Broker) -> dict[str, list[str]]:
    """In queue Q: three tasks of an unknown type and one stored in a newer format wait for a
    worker that can run them, after two tasks any worker runs; queue OTHER_Q has none waiting."""
    enqueue(broker, Q, count=2)
    enqueue(broker, OTHER_Q)
    return {
        UNKNOWN_TASK: park(broker, Q, UNKNOWN_TASK, 3),
        NEWER: park(broker, Q, NEWER, why=NEWER_FORMAT, reason=NEWER_REASON),
    }


def recent(epoch: float | None) -> bool:
    return epoch is not None and abs(time.time() - epoch) < 60


# The operations layer


def test_a_queue_lists_the_kinds_of_its_tasks_waiting_for_a_worker(parked):
    kinds = Operations().waiting_for_worker(Q)
    assert [(k.task, k.why, k.count, k.reason) for k in kinds] == [
        (UNKNOWN_TASK, UNKNOWN_TYPE, 3, f"unknown task type {UNKNOWN_TASK!r}"),
        (NEWER, NEWER_FORMAT, 1, NEWER_REASON),
    ]
    assert all(recent(kind.since) for kind in kinds)
    assert Operations().waiting_for_worker(OTHER_Q) == []
    assert Operations().queue_stats(Q).pending == 6  # they are pending all the same


def test_reading_the_waiting_tasks_needs_the_view_permission(parked):
    with pytest.raises(PermissionDenied, match="view_livetask"):
        Operations(User.objects.create_user("nobody", is_staff=True)).waiting_for_worker(Q)
    assert Operations(user_with("view_livetask", username="viewer")).waiting_for_worker(Q)


# The admin

DASHBOARD = "/admin/django_rtq/livetask/"


def notices(response) -> dict[tuple[str, str], str]:
    """The waiting-for-a-worker notices of a page, by (queue, task), as text."""
    found = re.findall(
        r'<p class="rtq-held rtq-waiting"[^>]*data-waiting-queue="([^"]*)" data-waiting-task="([^"]*)"'
        r"[^>]*>(.*?)</p>",
        response.content.decode(),
        re.S,
    )
    return {
        (html.unescape(queue), html.unescape(task)): " ".join(
            html.unescape(re.sub(r"<[^>]+>", "", text)).split()
        )
        for queue, task, text in found
    }


def test_the_dashboard_says_which_tasks_wait_for_a_worker_and_why(parked, viewer_client: Client):
    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 200
    assert notices(response) == {
        (Q, NEWER): f"Queue {Q}: 1 task of {NEWER} waits for a worker that can run it: {NEWER_REASON} "
        "(since just now).",
        (Q, UNKNOWN_TASK): f"Queue {Q}: 3 tasks of {UNKNOWN_TASK} wait for a worker that can run them: "
        f"unknown task type {UNKNOWN_TASK!r} (since just now).",
    }
    # they wait after every task that can run: the pending list read from its end shows them
    listed = reverse("admin:django_rtq_tasks", args=["pending"]) + f"?queue={Q}&amp;order=reverse"
    assert f'<a href="{listed}"' in response.content.decode()
    assert re.search(r'id="rtq-waiting-for-worker"[^>]*data-rtq-live', response.content.decode())


def test_the_admin_shows_no_notice_when_no_task_waits_for_a_worker(broker: Broker, viewer_client: Client):
    enqueue(broker, Q, count=2)
    for url in (DASHBOARD, reverse("admin:django_rtq_tasks", args=["pending"]) + f"?queue={Q}"):
        response = viewer_client.get(url)
        assert response.status_code == 200
        assert notices(response) == {}
        assert 'id="rtq-waiting-for-worker"' in response.content.decode()  # the auto-refresh's place


def test_a_queues_task_lists_say_which_of_its_tasks_wait_for_a_worker(parked, viewer_client: Client):
    for state in ("pending", "archived"):
        page = viewer_client.get(reverse("admin:django_rtq_tasks", args=[state]) + f"?queue={Q}")
        assert page.status_code == 200
        assert set(notices(page)) == {(Q, NEWER), (Q, UNKNOWN_TASK)}
        assert notices(page)[(Q, UNKNOWN_TASK)].startswith(f"3 tasks of {UNKNOWN_TASK} wait for a worker")
    other = viewer_client.get(reverse("admin:django_rtq_tasks", args=["pending"]) + f"?queue={OTHER_Q}")
    assert notices(other) == {}


def test_staff_without_the_view_permission_see_no_waiting_tasks(parked):
    client = logged_in(User.objects.create_user("staff", password="pw", is_staff=True))
    assert client.get(DASHBOARD).status_code == 403


# The API

API = "/rtq/api/"


def test_queues_in_the_api_have_their_tasks_waiting_for_a_worker(parked, reader_api: APIClient):
    detail = reader_api.get(f"{API}queues/{Q}/")
    assert detail.status_code == 200
    waiting = detail.json()["waiting_for_worker"]
    assert [{k: v for k, v in kind.items() if k != "since"} for kind in waiting] == [
        {
            "task": UNKNOWN_TASK,
            "why": UNKNOWN_TYPE,
            "count": 3,
            "reason": f"unknown task type {UNKNOWN_TASK!r}",
        },
        {"task": NEWER, "why": NEWER_FORMAT, "count": 1, "reason": NEWER_REASON},
    ]
    assert all(recent(datetime.fromisoformat(kind["since"]).timestamp()) for kind in waiting)
    listed = {queue["queue"]: queue for queue in reader_api.get(f"{API}queues/").json()}
    assert listed[Q]["waiting_for_worker"] == waiting
    assert listed[OTHER_Q]["waiting_for_worker"] == []
    assert reader_api.get(f"{API}queues/{OTHER_Q}/").json()["waiting_for_worker"] == []


# rtq_stats


def run_stats(*args: str) -> str:
    out = io.StringIO()
    call_command("rtq_stats", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_rtq_stats_lists_each_queues_tasks_waiting_for_a_worker(parked):
    output = run_stats()
    section = output.split(f"Queue {Q!r}, tasks waiting for a worker that can run them:\n", 1)[1]
    lines = section.split("\n\n", 1)[0].splitlines()
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines]
    assert rows[0] == ["TASK", "WHY", "TASKS", "WAITING FOR", "REASON"]
    assert [(row[0], row[1], row[2], row[4]) for row in rows[1:]] == [
        (UNKNOWN_TASK, UNKNOWN_TYPE, "3", f"unknown task type {UNKNOWN_TASK!r}"),
        (NEWER, NEWER_FORMAT, "1", NEWER_REASON),
    ]
    assert f"Queue {OTHER_Q!r}, tasks waiting" not in output
    assert "waiting for a worker" not in run_stats(OTHER_Q)


def test_rtq_stats_json_has_the_tasks_waiting_for_a_worker(parked):
    queues = {queue["queue"]: queue for queue in json.loads(run_stats("--json"))["queues"]}
    waiting = queues[Q]["waiting_for_worker"]
    assert [(k["task"], k["why"], k["count"], k["reason"]) for k in waiting] == [
        (UNKNOWN_TASK, UNKNOWN_TYPE, 3, f"unknown task type {UNKNOWN_TASK!r}"),
        (NEWER, NEWER_FORMAT, 1, NEWER_REASON),
    ]
    assert all(recent(datetime.fromisoformat(kind["since"]).timestamp()) for kind in waiting)
    assert queues[OTHER_Q]["waiting_for_worker"] == []


# Metrics


def waiting_samples(client: APIClient) -> dict[tuple[str, str, str], float]:
    response = client.get("/rtq/metrics/")
    assert response.status_code == 200
    return {
        (s.labels["queue"], s.labels["task"], s.labels["why"]): s.value
        for family in text_string_to_metric_families(response.content.decode())
        if family.name == "rtq_tasks_waiting_for_worker"
        for s in family.samples
    }


def test_the_metrics_count_the_tasks_waiting_for_a_worker_by_type_and_why(parked, reader_api: APIClient):
    assert waiting_samples(reader_api) == {
        (Q, NEWER, NEWER_FORMAT): 1,
        (Q, UNKNOWN_TASK, UNKNOWN_TYPE): 3,
    }


def test_the_metrics_have_no_waiting_tasks_when_none_wait(broker: Broker, reader_api: APIClient):
    enqueue(broker, Q, count=2)
    assert waiting_samples(reader_api) == {}


# One task waiting for a worker


def test_a_task_waiting_for_a_worker_says_so_and_is_not_held_back(parked, inspector):
    task = inspector.get_task(parked[UNKNOWN_TASK][0])
    assert task.waits_for_worker and not task.held
    pending = {t.id: t for t in inspector.list_tasks(Q, "pending")}
    assert [task_id for task_id, t in pending.items() if t.waits_for_worker] == [
        *parked[UNKNOWN_TASK],
        *parked[NEWER],
    ]  # after every task that can run, in the order they were enqueued
    assert not any(t.held for t in pending.values())
    assert Operations().held_reason(task) is None


def test_the_page_of_a_task_waiting_for_a_worker_says_why_and_the_list_marks_it(
    parked, viewer_client: Client
):
    page = viewer_client.get(reverse("admin:django_rtq_task", args=[parked[NEWER][0]]) + f"?queue={Q}")
    assert page.status_code == 200
    assert list(notices(page)) == [(Q, NEWER)]  # its own kind only
    assert "waits for a worker that can run it</span>" in page.content.decode()
    assert "rtq-held-reason" not in page.content.decode()

    listed = viewer_client.get(reverse("admin:django_rtq_tasks", args=["pending"]) + f"?queue={Q}")
    marked = re.findall(
        r'<tr data-task-id="([^"]+)">(?:(?!</tr>).)*?class="rtq-held-mark rtq-waiting-mark"',
        listed.content.decode(),
        re.S,
    )
    assert marked == [*parked[UNKNOWN_TASK], *parked[NEWER]]
    assert 'class="rtq-held-mark"' not in listed.content.decode()  # none held back

    [other] = enqueue(Operations().broker, Q)
    plain = viewer_client.get(reverse("admin:django_rtq_task", args=[other]) + f"?queue={Q}")
    assert notices(plain) == {} and "waits for a worker" not in plain.content.decode()

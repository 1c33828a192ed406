"""The transactional outbox made visible: how many tasks wait in it, how long the oldest has, and
how many failed to send, read through the operations layer by the admin, the API, `rtq_stats`
and the metrics, with the view permission of live state; each still answers what it can when
the outbox's database, or Redis, cannot be read."""

from __future__ import annotations

import html
import io
import json
import re
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from django_rtq import outbox
from django_rtq.models import OutboxTask
from django_rtq.operations import Operations
from tests.support.users import logged_in, user_with
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

#: How long the oldest row has waited in most tests, and that age as every surface writes it:
#: whole minutes once past an hour, so that the time a request takes does not change it.
OLDEST_AGE = timedelta(hours=2, minutes=5, seconds=30)
OLDEST_AGE_SHOWN = "2h 5m"
ERROR = "ResponseError: WRONGTYPE Operation against a key holding the wrong kind of value"


def store(count: int, *, queue: str = "default") -> list[OutboxTask]:
    """Store `count` tasks in the outbox, as a commit while Redis was away leaves them; oldest first."""
    outbox.store([tasks.add.using(queue=queue).prepare(n, n) for n in range(count)], using="default")
    return list(OutboxTask.objects.order_by("pk"))


def age(row: OutboxTask, by: timedelta = OLDEST_AGE) -> datetime:
    """Make `row` stored `by` ago (whole seconds); return when."""
    stored_at = (timezone.now() - by).replace(microsecond=0)
    OutboxTask.objects.filter(pk=row.pk).update(created_at=stored_at)
    return stored_at


def fail(row: OutboxTask, attempts: int = 3) -> None:
    """Record failed sends of `row`, as a relay does."""
    OutboxTask.objects.filter(pk=row.pk).update(attempts=attempts, last_error=ERROR)


@pytest.fixture
def waiting(broker) -> dict[str, object]:
    """Three tasks in the outbox, the oldest stored OLDEST_AGE ago, the second failing to send."""
    rows = store(3)
    stored_at = age(rows[0])
    fail(rows[1])
    return {"rows": rows, "oldest": stored_at}


@pytest.fixture
def outbox_unreadable(monkeypatch):
    """Make every read of the outbox fail in the database itself, as when its table cannot be
    read (a migration not applied, the database away)."""
    monkeypatch.setattr(OutboxTask._meta, "db_table", "django_rtq_no_such_outbox")


def test_reading_the_outbox_needs_the_view_permission(waiting):
    nobody = User.objects.create_user("nobody", is_staff=True)
    viewer = user_with("view_livetask", username="viewer")
    for read in (lambda ops: ops.outbox_stats(), lambda ops: list(ops.outbox_tasks())):
        with pytest.raises(PermissionDenied, match="view_livetask"):
            read(Operations(nobody))
        assert read(Operations(viewer))


# The admin

DASHBOARD = "/admin/django_rtq/livetask/"
OUTBOX_PAGE = "/admin/django_rtq/livetask/outbox/"


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def outbox_line(response) -> str:
    """The dashboard's outbox line, as text."""
    found = re.search(r'<p [^>]*id="rtq-outbox"[^>]*>(.*?)</p>', response.content.decode(), re.S)
    assert found, "no outbox line on the dashboard"
    return text_of(found[1])


def listed_rows(response) -> list[list[str]]:
    """The cells of each row of the outbox page's table, as text."""
    rows = re.findall(r"<tr data-task-id=[^>]*>(.*?)</tr>", response.content.decode(), re.S)
    return [[text_of(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


def test_the_dashboard_shows_the_tasks_waiting_the_oldests_age_and_those_failing(waiting, viewer_client):
    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 200
    assert outbox_line(response) == (
        f"Outbox: 3 tasks waiting to be sent to Redis, the oldest for {OLDEST_AGE_SHOWN}. "
        "1 could not be sent; see their last error."
    )
    link = f'<a href="{reverse("admin:django_rtq_outbox")}">see their last error</a>'
    assert link in response.content.decode()


def test_the_dashboard_says_when_the_outbox_is_empty_and_mentions_no_failure(broker, viewer_client):
    assert outbox_line(viewer_client.get(DASHBOARD)) == "Outbox: empty"

    store(1)
    line = outbox_line(viewer_client.get(DASHBOARD))
    assert line.startswith("Outbox: 1 task waiting to be sent to Redis, the oldest for ")
    assert "could not be sent" not in line


@pytest.mark.django_db(transaction=True)  # a failed query must not end the test's transaction
def test_the_dashboard_shows_redis_when_the_outbox_cannot_be_read(
    broker, viewer_client, outbox_unreadable, caplog
):
    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 200
    assert outbox_line(response) == "Outbox: unknown (its database could not be read)"
    assert '<tr data-queue="default">' in response.content.decode()
    assert "the dashboard could not read the outbox" in caplog.text


def test_the_outbox_page_lists_the_waiting_tasks_oldest_first_with_their_errors(waiting, viewer_client):
    response = viewer_client.get(OUTBOX_PAGE)
    assert response.status_code == 200
    rows = waiting["rows"]
    listed = listed_rows(response)
    assert [cells[:3] for cells in listed] == [[row.task_id, row.task_name, row.queue] for row in rows]
    assert [cells[4:] for cells in listed] == [["0", ""], ["3", ERROR], ["0", ""]]
    assert listed[0][3] == "2 hours ago"
    summary = re.search(r'<p id="rtq-outbox-summary">(.*?)</p>', response.content.decode(), re.S)
    assert summary and text_of(summary[1]) == (
        f"3 tasks waiting to be sent to Redis, the oldest for {OLDEST_AGE_SHOWN}; 1 could not be sent."
    )


def test_the_outbox_page_lists_the_oldest_hundred(broker, viewer_client):
    rows = store(101)
    response = viewer_client.get(OUTBOX_PAGE)
    listed = [cells[0] for cells in listed_rows(response)]
    assert listed == [row.task_id for row in rows[:100]]
    assert "The oldest 100 are listed." in text_of(response.content.decode())


def test_the_outbox_page_says_when_it_is_empty(broker, viewer_client):
    response = viewer_client.get(OUTBOX_PAGE)
    assert response.status_code == 200
    assert listed_rows(response) == []
    assert "The outbox is empty: every task enqueued is in Redis." in text_of(response.content.decode())


def test_the_outbox_page_works_while_redis_is_away(waiting, viewer_client, redis_away):
    response = viewer_client.get(OUTBOX_PAGE)
    assert response.status_code == 200
    assert len(listed_rows(response)) == 3


def test_the_page_that_says_redis_is_away_links_to_the_tasks_waiting_in_the_outbox(
    waiting, viewer_client, redis_away
):
    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 503
    page = response.content.decode()
    assert f'<a href="{OUTBOX_PAGE}">3 tasks waiting</a>' in page


OUTBOX_ACTION = "/admin/django_rtq/livetask/actions/outbox/"


def test_giving_up_tasks_of_the_outbox_asks_first_then_deletes_them(waiting):
    changer = logged_in(user_with("change_livetask", username="changer"))
    page = changer.get(OUTBOX_PAGE).content.decode()
    gone, kept = waiting["rows"][1], waiting["rows"][0]
    assert f'name="ids" value="{gone.task_id}"' in page  # a Delete button per row

    asked = changer.post(OUTBOX_ACTION, {"ids": [gone.task_id]})
    assert asked.status_code == 200
    assert "Delete 1 task from the outbox? They are never sent to Redis" in text_of(asked.content.decode())
    assert OutboxTask.objects.count() == 3

    done = changer.post(
        OUTBOX_ACTION, {"ids": [gone.task_id, "sent-meanwhile"], "confirm": "yes"}, follow=True
    )
    said = text_of(done.content.decode())
    assert "1 task deleted from the outbox: never sent." in said
    assert "1 selected task no longer in the outbox: sent meanwhile." in said
    assert set(OutboxTask.objects.values_list("task_id", flat=True)) == {
        kept.task_id,
        waiting["rows"][2].task_id,
    }


def test_giving_up_tasks_of_the_outbox_needs_the_change_permission(waiting, viewer_client):
    assert 'name="ids"' not in viewer_client.get(OUTBOX_PAGE).content.decode()
    task_id = waiting["rows"][0].task_id
    assert viewer_client.post(OUTBOX_ACTION, {"ids": [task_id], "confirm": "yes"}).status_code == 403
    with pytest.raises(PermissionDenied, match="change_livetask"):
        Operations(User.objects.get(username="viewer")).delete_outbox_tasks([task_id])
    assert OutboxTask.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_outbox_page_says_when_its_database_cannot_be_read(broker, viewer_client, outbox_unreadable):
    response = viewer_client.get(OUTBOX_PAGE)
    assert response.status_code == 200
    assert "The outbox's database cannot be read: " in text_of(response.content.decode())
    assert listed_rows(response) == []


def test_staff_without_the_view_permission_see_no_outbox(waiting):
    client = logged_in(User.objects.create_user("staff", password="pw", is_staff=True))
    assert client.get(DASHBOARD).status_code == 403
    assert client.get(OUTBOX_PAGE).status_code == 403


# The API

API = "/rtq/api/"


def test_the_api_counts_the_tasks_waiting_and_dates_the_oldest(waiting, reader_api):
    response = reader_api.get(f"{API}outbox/")
    assert response.status_code == 200
    data = response.json()
    assert (data["waiting"], data["failing"]) == (3, 1)
    assert datetime.fromisoformat(data["oldest"]) == waiting["oldest"]
    assert OLDEST_AGE.total_seconds() <= data["oldest_age_seconds"] < OLDEST_AGE.total_seconds() + 60


def test_the_api_shows_an_empty_outbox(broker, reader_api):
    response = reader_api.get(f"{API}outbox/")
    assert response.status_code == 200
    assert response.json() == {"waiting": 0, "oldest": None, "oldest_age_seconds": None, "failing": 0}


def test_the_api_answers_about_the_outbox_while_redis_is_away(waiting, reader_api, redis_away):
    assert reader_api.get(f"{API}queues/").status_code == 503
    response = reader_api.get(f"{API}outbox/")
    assert response.status_code == 200
    assert response.json()["waiting"] == 3


def test_the_api_refuses_the_outbox_without_the_view_permission(waiting):
    client = APIClient()
    client.force_authenticate(User.objects.create_user("someone", is_staff=True))
    assert client.get(f"{API}outbox/").status_code == 403


def test_the_schema_describes_the_outbox(broker, reader_api):
    schema = reader_api.get(f"{API}schema/", {"format": "json"}).json()
    operation = schema["paths"]["/rtq/api/outbox/"]["get"]
    assert operation["operationId"] == "get_outbox"
    ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    component = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert component["required"] == ["failing", "oldest", "oldest_age_seconds", "waiting"]
    assert component["properties"]["oldest"] == {
        "type": "string",
        "format": "date-time",
        "nullable": True,
        "description": "When the oldest waiting task was stored; null when none waits.",
    }
    assert component["properties"]["oldest_age_seconds"]["type"] == "number"


# rtq_stats


def run_stats(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("rtq_stats", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_rtq_stats_says_how_many_wait_since_when_and_how_many_fail(waiting):
    output, _ = run_stats()
    assert f"\nOutbox: 3 waiting, oldest {OLDEST_AGE_SHOWN} ago, 1 failing\n" in output


def test_rtq_stats_json_has_the_outbox(waiting):
    data = json.loads(run_stats("--json")[0])["outbox"]
    assert (data["waiting"], data["failing"]) == (3, 1)
    assert datetime.fromisoformat(data["oldest"]) == waiting["oldest"]
    assert OLDEST_AGE.total_seconds() <= data["oldest_age_seconds"] < OLDEST_AGE.total_seconds() + 60


def test_rtq_stats_says_when_the_outbox_is_empty(broker):
    output, _ = run_stats("default")
    assert "\nOutbox: empty\n" in output
    assert json.loads(run_stats("default", "--json")[0])["outbox"] == {
        "waiting": 0,
        "oldest": None,
        "oldest_age_seconds": None,
        "failing": 0,
    }


@pytest.mark.django_db(transaction=True)
def test_rtq_stats_shows_the_queues_when_the_outbox_cannot_be_read(broker, outbox_unreadable):
    output, errors = run_stats()
    assert output.startswith("QUEUE ")
    assert "\nOutbox: unknown (its database could not be read)\n" in output
    assert errors.startswith("The outbox's database could not be read: ")
    data = json.loads(run_stats("--json")[0])
    assert data["outbox"] is None and data["queues"]


# Metrics


def scrape(client: APIClient) -> dict[str, list[float]]:
    response = client.get("/rtq/metrics/")
    assert response.status_code == 200
    return {
        family.name: [sample.value for sample in family.samples]
        for family in text_string_to_metric_families(response.content.decode())
    }


def outbox_samples(metrics: dict[str, list[float]]) -> dict[str, list[float]]:
    return {name: values for name, values in metrics.items() if name.startswith("rtq_outbox_")}


def test_the_metrics_have_the_outbox_waiting_its_oldests_age_and_failing(waiting, reader_api):
    samples = outbox_samples(scrape(reader_api))
    [age_seconds] = samples.pop("rtq_outbox_oldest_age_seconds")
    assert OLDEST_AGE.total_seconds() <= age_seconds < OLDEST_AGE.total_seconds() + 60
    assert samples == {"rtq_outbox_waiting": [3], "rtq_outbox_failing": [1]}


def test_the_metrics_of_an_empty_outbox_are_zero(broker, reader_api):
    assert outbox_samples(scrape(reader_api)) == {
        "rtq_outbox_waiting": [0],
        "rtq_outbox_oldest_age_seconds": [0],
        "rtq_outbox_failing": [0],
    }


def test_the_metrics_have_the_outbox_while_redis_is_away(waiting, reader_api, redis_away):
    metrics = scrape(reader_api)
    assert metrics["rtq_redis_up"] == [0]
    assert metrics["rtq_outbox_waiting"] == [3]


@pytest.mark.django_db(transaction=True)
def test_the_metrics_have_redis_when_the_outbox_cannot_be_read(broker, reader_api, outbox_unreadable):
    metrics = scrape(reader_api)
    assert metrics["rtq_redis_up"] == [1]
    assert "rtq_tasks" in metrics
    assert outbox_samples(metrics) == {}


def test_the_metrics_refuse_the_outbox_without_the_view_permission(waiting):
    client = APIClient()
    client.force_authenticate(User.objects.create_user("someone", is_staff=True))
    assert client.get("/rtq/metrics/").status_code == 403

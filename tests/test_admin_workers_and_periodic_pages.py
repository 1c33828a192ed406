"""The admin's workers and periodic-tasks pages: what each lists, what a broken setting shows,
the permission they need."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.utils import timezone

from tests.support.admin_pages import DASHBOARD, task_url, text
from tests.support.polling import wait_for
from tests.testapp import tasks as testapp_tasks

pytestmark = pytest.mark.django_db


WORKERS = "/admin/django_rtq/livetask/workers/"


PERIODIC = "/admin/django_rtq/livetask/periodic/"


def test_the_workers_page_lists_each_worker_and_what_it_runs(broker, superuser_client, run_worker):
    message = testapp_tasks.block.enqueue("seen-on-the-workers-page")
    with run_worker(concurrency=3):
        wait_for(lambda: any(w.get("active") for w in broker.workers()), message="a running task")
        page = superuser_client.get(WORKERS)
        broker.client.set(testapp_tasks.report_key("release:seen-on-the-workers-page"), "1")

    assert page.status_code == 200
    [described] = page.context["workers"]
    assert described["concurrency"] == 3
    assert described["free"] == 2
    assert described["settings"] == "tests.settings"
    assert "<code>tests.settings</code>" in page.text
    assert [task["id"] for task in described["tasks"]] == [message.id]
    assert "1 live worker, running 1 task of 3 at most." in text(page)
    assert f'href="{task_url(message.id, "default")}"' in page.text


def test_the_workers_page_without_workers_says_how_to_start_one(broker, superuser_client):
    assert "No live workers" in text(superuser_client.get(WORKERS))


def test_the_periodic_page_shows_schedule_task_and_ticks(broker, superuser_client, settings):
    settings.RTQ = {
        **settings.RTQ,
        "PERIODIC": {
            "nightly": {"task": "tests.testapp.tasks.record", "cron": "0 3 * * *", "args": ["n"]},
            "often": {"task": "tests.testapp.tasks.record", "every": 90, "args": ["o"]},
        },
    }
    tick_ms = 1_700_000_000_000
    broker.client.hset(broker.queue("default").periodic, "often", tick_ms)

    page = superuser_client.get(PERIODIC)

    assert page.status_code == 200
    assert page.context["problem"] is None
    rows = {row["name"]: row for row in page.context["schedules"]}
    assert rows["nightly"]["when"].startswith("cron 0 3 * * *")
    assert rows["nightly"]["task"] == "tests.testapp.tasks.record"
    assert rows["nightly"]["last_tick"] is None
    assert timezone.localtime(rows["nightly"]["next_run"]).hour == 3  # cron in the project's time zone
    assert rows["often"]["when"] == "every 1m 30s"
    assert rows["often"]["last_tick"] == datetime.fromtimestamp(tick_ms / 1000, UTC)
    assert rows["often"]["last_task_url"] == task_url(f"periodic:often:{tick_ms}", "default")
    assert 0 < rows["often"]["next_run"].timestamp() - time.time() <= 90
    assert "not yet" in text(page)


def test_a_broken_periodic_setting_is_said_on_the_page(broker, superuser_client, settings):
    settings.RTQ = {**settings.RTQ, "PERIODIC": {"x": {"task": "no.such.task", "every": 5}}}
    page = superuser_client.get(PERIODIC)
    assert page.status_code == 200
    assert "no.such.task" in text(page)


@pytest.mark.parametrize("url", [WORKERS, PERIODIC])
def test_the_new_pages_need_the_view_permission(broker, outsider_client, viewer_client, url):
    assert outsider_client.get(url).status_code == 403
    assert viewer_client.get(url).status_code == 200


def test_the_dashboard_links_the_new_pages(broker, superuser_client):
    page = superuser_client.get(DASHBOARD)
    assert f'href="{WORKERS}"' in page.text and f'href="{PERIODIC}"' in page.text

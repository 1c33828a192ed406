"""Every live page of the admin offers auto-refresh, off by default, and a refresh request gets
the parts it swaps."""

from __future__ import annotations

import re

import pytest

from django_rtq.broker import TaskState
from tests.support.admin_pages import DASHBOARD, Q, row_ids, task_url, tasks_url
from tests.support.factories import make_tasks

pytestmark = pytest.mark.django_db


S = TaskState


WORKERS = "/admin/django_rtq/livetask/workers/"


PERIODIC = "/admin/django_rtq/livetask/periodic/"


def test_every_live_page_offers_auto_refresh_off_by_default(broker, superuser_client):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)
    for url in (DASHBOARD, tasks_url("archived", queue=Q), task_url(task_id), WORKERS, PERIODIC):
        page = superuser_client.get(url)
        assert '<input type="checkbox" id="rtq-auto-refresh">' in page.text, url  # unchecked
        assert "data-rtq-live" in page.text, url


def test_a_refresh_request_gets_the_parts_it_swaps(broker, superuser_client):
    make_tasks(broker, S.ARCHIVED, Q, count=2)
    page = superuser_client.get(tasks_url("archived", queue=Q), headers={"X-RTQ-Refresh": "1"})

    for part in ("rtq-results", "rtq-pager", "rtq-queue-filter"):
        assert re.search(rf'id="{part}"[^>]*data-rtq-live', page.text), part
    assert len(row_ids(page)) == 2

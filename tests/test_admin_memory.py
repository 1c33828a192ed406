"""Memory per queue in the admin: it grows with a queue's tasks, shows on the dashboard, and is a
dash where Redis refuses MEMORY USAGE."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from django_rtq.connection import get_broker
from django_rtq.operations import Operations
from django_rtq.templatetags.rtq_admin import rtq_when
from tests.support.admin_pages import DASHBOARD, Q
from tests.support.factories import enqueue

pytestmark = pytest.mark.django_db


def test_memory_per_queue_grows_with_its_tasks(broker, inspector):
    empty = inspector.memory_usage(Q)
    enqueue(broker, Q, count=200, args=["x" * 200])

    assert empty == 0
    assert inspector.memory_usage(Q) > 200 * 200
    assert Operations().queue_memory(Q) == inspector.memory_usage(Q)


def test_the_dashboard_shows_memory_per_queue(broker, superuser_client):
    enqueue(broker, Q, count=50)
    page = superuser_client.get(DASHBOARD)
    [emails] = [queue for queue in page.context["queues"] if queue["name"] == Q]
    assert emails["memory"] > 0
    assert f'data-memory="{emails["memory"]}"' in page.text


def test_a_redis_that_refuses_memory_usage_shows_a_dash(prefix, superuser_client):
    from django_rtq.testing import use_fake_redis

    with use_fake_redis():  # fakeredis has no MEMORY, as some managed Redis refuse it
        enqueue(get_broker(), Q, count=3)
        page = superuser_client.get(DASHBOARD)
    assert page.status_code == 200
    [emails] = [queue for queue in page.context["queues"] if queue["name"] == Q]
    assert emails["memory"] is None and 'title="Redis refuses MEMORY USAGE here">—</td>' in page.text


def test_times_read_the_same_without_time_zone_support(settings):
    settings.USE_TZ = False
    assert ">3 minutes ago</time>" in rtq_when(time.time() - 180)
    assert ">in 2 hours</time>" in rtq_when(datetime.now() + timedelta(hours=2, seconds=30))


def test_memory_needs_the_view_permission(broker, outsider_client):
    from django.contrib.auth.models import User
    from django.core.exceptions import PermissionDenied

    with pytest.raises(PermissionDenied):
        Operations(User.objects.get(username="outsider")).queue_memory(Q)
    with pytest.raises(PermissionDenied):
        Operations(User.objects.get(username="outsider")).schedules()

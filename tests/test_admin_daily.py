"""The admin as a daily tool: page sizes, order, per-row actions, emptying a state, the workers and
periodic tasks pages, memory per queue, human times, labels in words, JSON and tracebacks as written."""

from __future__ import annotations

import html
import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template
from django.utils import timezone

from django_rtq.admin_views.tasks import PAGE_SIZES, PER_PAGE
from django_rtq.broker import TaskState
from django_rtq.connection import get_broker
from django_rtq.models import FinishedTask
from django_rtq.operations import Operations
from django_rtq.templatetags.rtq_admin import rtq_count, rtq_short, rtq_when
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
from tests.testapp import tasks as testapp_tasks

pytestmark = pytest.mark.django_db

S = TaskState
WORKERS = "/admin/django_rtq/livetask/workers/"
PERIODIC = "/admin/django_rtq/livetask/periodic/"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "app/tasks.py", line 12, in send\n'
    "    deliver(message)\n"
    '  File "app/mail.py", line 40, in deliver\n'
    "        raise SMTPError(code)\n"
    "SMTPError: 421"
)


# Lists: page size, order, per-row actions, emptying a state


def test_the_page_size_is_chosen_among_a_few(broker, superuser_client):
    ids = make_tasks(broker, S.SCHEDULED, Q, count=PAGE_SIZES[0] + 5)

    assert len(row_ids(superuser_client.get(tasks_url("scheduled", queue=Q)))) == min(len(ids), PER_PAGE)
    small = superuser_client.get(tasks_url("scheduled", queue=Q, per_page="20"))
    assert len(row_ids(small)) == 20
    assert "per_page=20" in small.context["page_links"][1][1]  # the pager keeps the size
    assert [size for size, current, _ in small.context["page_sizes"] if current] == [20]
    odd = superuser_client.get(tasks_url("scheduled", queue=Q, per_page="7"))
    assert len(row_ids(odd)) == len(ids)  # not a size offered: the default (50)


def test_the_list_reads_either_end_of_its_sorted_set(broker, superuser_client):
    ids = []
    for _ in range(3):
        ids += make_tasks(broker, S.ARCHIVED, Q)
        time.sleep(0.002)  # distinct archive times (ms): the order under test
    newest_first = row_ids(superuser_client.get(tasks_url("archived", queue=Q)))
    oldest_first = superuser_client.get(tasks_url("archived", queue=Q, order="reverse"))

    assert newest_first == ids[::-1]
    assert row_ids(oldest_first) == ids
    assert [label for label, current, _ in oldest_first.context["orders"] if current] == ["oldest first"]


def test_the_inspector_reads_a_page_from_the_other_end(broker, inspector):
    ids = enqueue(broker, Q, count=5)

    assert [t.id for t in inspector.list_tasks(Q, S.PENDING, offset=1, limit=2, reverse=True)] == ids[::-1][
        1:3
    ]
    assert [t.id for t in Operations().list_tasks(Q, S.PENDING, limit=10, reverse=True)] == ids[::-1]


def test_a_row_button_acts_on_its_task_after_asking(broker, superuser_client):
    kept, chosen = make_tasks(broker, S.ARCHIVED, Q, count=2)
    listing = superuser_client.get(tasks_url("archived", queue=Q))
    assert f'form="rtq-row-form" name="row" value="run:{chosen}"' in listing.text
    assert f'value="delete:{chosen}"' in listing.text

    data = {"row": f"run:{chosen}", "queue": Q, "state": "archived", "next": tasks_url("archived", queue=Q)}
    asked = superuser_client.post(ACTION_URL, data)
    assert "Run now: 1 selected task of queue 'emails'?" in text(asked)
    assert set(ids_in(broker, Q, S.ARCHIVED)) == {kept, chosen}  # asked first: nothing done yet
    done = superuser_client.post(ACTION_URL, {**dict(asked.context["hidden"]), "confirm": "yes"})

    assert messages_of(done) == ["1 task of queue 'emails' moved to pending."]
    assert ids_in(broker, Q, S.PENDING) == [chosen]
    assert ids_in(broker, Q, S.ARCHIVED) == [kept]


def test_a_row_button_for_an_action_the_state_refuses_does_nothing(broker, superuser_client):
    [task_id] = make_tasks(broker, S.PENDING, Q)
    data = {"row": f"run:{task_id}", "queue": Q, "state": "pending", "confirm": "yes"}

    assert messages_of(superuser_client.post(ACTION_URL, data)) == [
        "That action does not apply to pending tasks."
    ]
    assert ids_in(broker, Q, S.PENDING) == [task_id]


def test_viewers_get_no_row_buttons_and_may_not_post_one(broker, viewer_client):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)

    listing = viewer_client.get(tasks_url("archived", queue=Q))
    assert 'name="row"' not in listing.text and "Empty this state" not in listing.text
    data = {"row": f"delete:{task_id}", "queue": Q, "state": "archived", "confirm": "yes"}
    assert viewer_client.post(ACTION_URL, data).status_code == 403
    assert ids_in(broker, Q, S.ARCHIVED) == [task_id]


def test_empty_this_state_deletes_the_whole_state_after_asking(broker, superuser_client):
    make_tasks(broker, S.ARCHIVED, Q, count=3)
    [scheduled] = make_tasks(broker, S.SCHEDULED, Q)
    listing = superuser_client.get(tasks_url("archived", queue=Q))
    form = re.search(r'<form[^>]*id="rtq-empty-state">(.*?)</form>', listing.text, re.S).group(1)
    data = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))
    data.pop("csrfmiddlewaretoken")
    assert data == {
        "queue": Q,
        "state": "archived",
        "next": html.unescape(listing.context["here"]),
        "action": "delete",
        "scope": "all",
    }

    done = confirm(superuser_client, ACTION_URL, data)

    assert "/livetask/bulk/" in done["Location"]
    assert ids_in(broker, Q, S.ARCHIVED) == []
    assert ids_in(broker, Q, S.SCHEDULED) == [scheduled]


def test_no_empty_button_where_delete_does_not_apply(broker, superuser_client):
    make_tasks(broker, S.ACTIVE, Q)
    assert "Empty this state" not in superuser_client.get(tasks_url("active", queue=Q)).text


# Workers and periodic tasks


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


# Memory per queue


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


# Numbers, times, labels, JSON and tracebacks


def test_counts_have_thousands_separators_everywhere(broker, superuser_client):
    enqueue(broker, Q, count=1234)

    dashboard = superuser_client.get(DASHBOARD)
    listing = superuser_client.get(tasks_url("pending", queue=Q))

    assert re.search(r'data-state="pending">1,234</a>', dashboard.text)
    assert f"{Q} (1,234)" in text(listing)
    assert "1,234 tasks, page 1 of 25" in text(listing)
    assert "Apply to all 1,234 pending tasks" in text(listing)


def test_the_filters():
    assert rtq_count(1234567) == "1,234,567"
    assert rtq_count(0) == "0"
    assert rtq_count(None) == ""
    assert (
        rtq_short("<a long id>")
        == '<span class="rtq-trunc" title="&lt;a long id&gt;">&lt;a long id&gt;</span>'
    )
    when = rtq_when(time.time() - 180)
    assert ">3 minutes ago</time>" in when
    assert re.search(r'title="[^"]*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z · epoch \d+\.\d{3}"', when)
    assert ">in 2 hours</time>" in rtq_when(time.time() + 2 * 3600 + 30)
    assert rtq_when("not a time") == ""
    rendered = Template("{% load rtq_admin %}{{ value|rtq_json }}").render(
        Context({"value": {"a": [1, "é"]}})
    )
    assert '<pre class="rtq-pre">{\n  &quot;a&quot;: [\n    1,\n    &quot;é&quot;\n  ]\n}</pre>' in rendered
    assert 'class="rtq-copy"' in rendered


def test_the_task_page_reads_like_words_not_fields(broker, superuser_client, run_worker):
    message = testapp_tasks.always_fails.using(priority=3).enqueue("words")
    with run_worker():
        wait_for(lambda: ids_in(broker, "default", S.ARCHIVED) == [message.id], message="archived")
    qk = broker.queue("default")
    info = json.loads(broker.client.hget(qk.info, message.id))
    broker.client.hset(qk.info, message.id, json.dumps({**info, "traceback": TRACEBACK}))

    page = superuser_client.get(task_url(message.id, "default"))
    body = text(page)

    labels = [label for label, _ in page.context["facts"]]
    assert "First attempt started" in labels and "Worker of the latest attempt" in labels
    assert not [label for label in labels if "_" in label]
    for internal in ("<th>started_at</th>", "<th>attempted_at</th>", "<th>max retries</th>"):
        assert internal not in page.text
    assert re.search(
        r'<time class="rtq-time" datetime="[^"]+" data-epoch="\d+\.\d{3}" title="[^"]*epoch', page.text
    )
    # the local time in full, then how long ago
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+ \((just now|\d+ \w+ ago)\)</time>", page.text)
    assert '<pre class="rtq-pre">[\n  "words"\n]</pre>' in body
    assert '<pre class="rtq-pre">{}</pre>' in body  # no keyword arguments
    assert f'<pre class="rtq-pre">{TRACEBACK}</pre>' in body  # as written: indentation kept
    assert body.count('class="rtq-copy"') >= 4  # args, kwargs, each attempt's error, traceback


def test_nested_arguments_are_indented_json(broker, superuser_client):
    [task_id] = make_tasks(broker, S.PENDING, Q, kwargs={"value": {"nested": [1, 2]}})
    body = text(superuser_client.get(task_url(task_id)))
    assert (
        '<pre class="rtq-pre">{\n  "value": {\n    "nested": [\n      1,\n      2\n    ]\n  }\n}</pre>'
        in body
    )


def test_a_workflow_shows_its_times_not_milliseconds(broker, superuser_client):
    from tests.support.factories import make_workflows

    [workflow_id] = make_workflows(broker, Q, 1)
    created_ms = int(time.time() * 1000) - 120_000
    broker.client.hset(broker.queue(Q).workflow(workflow_id), "created", created_ms)

    page = superuser_client.get(task_url(workflow_id))

    facts = dict(page.context["workflow"])
    assert facts["Created"] == datetime.fromtimestamp(created_ms / 1000, UTC)
    assert facts["Children"] == 1 and facts["Kind"] == "group"
    assert str(created_ms) not in page.text
    assert "2 minutes ago" in page.text


def test_the_finished_record_shows_json_and_the_traceback_as_written(broker, superuser_client):
    FinishedTask.objects.create(
        task_id="done-1",
        task_name="app.tasks.send",
        queue=Q,
        status=FinishedTask.Status.FAILED,
        args=["to@example.com", {"retry": True}],
        kwargs={"subject": "Hi"},
        traceback=TRACEBACK,
        errors=[{"type": "SMTPError", "message": "421"}],
        finished_at=timezone.now(),
    )

    page = superuser_client.get("/admin/django_rtq/finishedtask/done-1/change/")
    body = text(page)

    assert page.status_code == 200
    assert f'<pre class="rtq-pre">{TRACEBACK}</pre>' in body
    assert '<pre class="rtq-pre">[\n  "to@example.com",\n  {\n    "retry": true\n  }\n]</pre>' in body
    assert '<pre class="rtq-pre">{\n  "subject": "Hi"\n}</pre>' in body
    assert "django_rtq/rtq.js" in page.text  # its copy buttons work there too


# Auto-refresh


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

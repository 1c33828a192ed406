"""The admin shows values as people read them: counts with separators, human times, labels in
words, JSON indented and tracebacks as written."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime

import pytest
from django.template import Context, Template
from django.utils import timezone

from django_rtq.broker import TaskState
from django_rtq.models import FinishedTask
from django_rtq.templatetags.rtq_admin import rtq_count, rtq_short, rtq_when
from tests.support.admin_pages import DASHBOARD, Q, task_url, tasks_url, text
from tests.support.factories import enqueue, make_tasks
from tests.support.polling import wait_for
from tests.support.reading import ids_in
from tests.testapp import tasks as testapp_tasks

pytestmark = pytest.mark.django_db


S = TaskState


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "app/tasks.py", line 12, in send\n'
    "    deliver(message)\n"
    '  File "app/mail.py", line 40, in deliver\n'
    "        raise SMTPError(code)\n"
    "SMTPError: 421"
)


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

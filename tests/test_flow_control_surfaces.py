"""Flow control made visible: every limit, the tasks it holds back and its use now, and why a
held-back task waits, read through the operations layer by the admin, the API, `rtq_stats` and
the metrics, with the view permission of live state."""

from __future__ import annotations

import html
import io
import json
import re
import uuid

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from django_rtq import registry
from django_rtq.broker import Broker, TaskMessage, TaskState
from django_rtq.broker.inspect import Inspector, LimitUse
from django_rtq.broker.limits import QUEUE_SCOPE, FlowLimits, Limit
from django_rtq.connection import get_broker
from django_rtq.operations import Operations
from tests.support.clock import START_TIME, FakeClock
from tests.support.factories import WORKER, done, forget
from tests.support.users import logged_in, user_with

pytestmark = pytest.mark.django_db

Q = "emails"  # the limited task types' queue
OTHER_Q = "low"
#: Registered by the `limited` fixture: at most one running; one start a minute; at most two
#: running, in another queue.
PAY, SEND, REPORT = "tests.surfaces.pay", "tests.surfaces.send", "tests.surfaces.report"
PAY_LIMIT = Limit(max_concurrency=1)
SEND_LIMIT = Limit(rate=1, period=60.0)
REPORT_LIMIT = Limit(max_concurrency=2)
QUEUE_LIMIT = Limit(rate=100, period=60.0, burst=10, max_concurrency=5)
QUEUE_LIMITS = {Q: {"rate_limit": "100/m", "burst": 10, "max_concurrency": 5}}


def noop() -> None:
    return None


@pytest.fixture
def limited(prefix: str, clock: FakeClock, settings):
    """The process's broker on a fake clock, with three limited task types registered and a limit
    on queue Q; the types are taken out of the registry again after the test."""
    settings.RTQ = {**settings.RTQ, "QUEUE_LIMITS": QUEUE_LIMITS}
    broker = get_broker()  # the one the surfaces use, now that the settings are final
    broker.clock = clock
    types = {
        PAY: registry.task(name=PAY, queue=Q, max_concurrency=1)(noop),
        SEND: registry.task(name=SEND, queue=Q, rate_limit="1/m")(noop),
        REPORT: registry.task(name=REPORT, queue=OTHER_Q, max_concurrency=2)(noop),
    }
    yield broker
    for name in types:
        forget(name)


def add(broker: Broker, task: str, count: int = 1, queue: str = Q) -> list[str]:
    messages = [
        TaskMessage(id=uuid.uuid4().hex, task=task, queue=queue, enqueued_at=START_TIME) for _ in range(count)
    ]
    broker.enqueue(messages)
    return [message.id for message in messages]


def claim(broker: Broker, queue: str = Q) -> list[str]:
    return [task.id for task in broker.claim(queue, worker_id=WORKER, limit=10)]


@pytest.fixture
def held(limited: Broker) -> dict[str, list[str]]:
    """Two tasks of PAY and of SEND started, one of each, the others held back; returns the ids
    of each type, the started one first."""
    ids = {PAY: add(limited, PAY, 2), SEND: add(limited, SEND, 2)}
    assert set(claim(limited)) == {ids[PAY][0], ids[SEND][0]}
    return ids


# The inspector


def test_each_limit_is_listed_with_its_running_tasks_held_ones_and_tokens(
    any_broker: Broker, clock: FakeClock
):
    flow = {
        "a.pay": Limit(rate=2, period=1.0, burst=2, max_concurrency=3),
        QUEUE_SCOPE: Limit(max_concurrency=5),
    }
    any_broker.limits = lambda: FlowLimits(types={"a.pay": flow["a.pay"]}, queues={Q: flow[QUEUE_SCOPE]})
    pay = add(any_broker, "a.pay", 5)
    mail = add(any_broker, "a.mail")
    assert claim(any_broker) == [*pay[:2], *mail]  # the bucket of 2 lets two start; three held

    records = Inspector(any_broker).limit_use(Q, flow)
    assert records == [
        LimitUse(scope=QUEUE_SCOPE, limit=flow[QUEUE_SCOPE], running=3, held=0, tokens=None),
        LimitUse(scope="a.pay", limit=flow["a.pay"], running=2, held=3, tokens=0.0),
    ]
    assert records[1].next_start_in == pytest.approx(0.5)

    clock.advance(0.25)  # refilled at 2 a second
    [_, pay_now] = Inspector(any_broker).limit_use(Q, flow)
    assert pay_now.tokens == pytest.approx(0.5) and pay_now.next_start_in == pytest.approx(0.25)
    any_broker.complete(Q, [done(pay[0])], worker_id=WORKER)
    [queue_now, pay_now] = Inspector(any_broker).limit_use(Q, flow)
    assert (queue_now.running, pay_now.running, pay_now.held) == (2, 1, 3)


def test_use_left_by_a_limit_no_longer_in_force_is_listed_without_it(any_broker: Broker):
    before = FlowLimits(types={"a.pay": Limit(max_concurrency=1)}, queues={Q: Limit(max_concurrency=9)})
    any_broker.limits = lambda: before
    pay = add(any_broker, "a.pay", 3)
    assert claim(any_broker) == pay[:1]

    # the limits changed with a deploy: none any more, until the next claim releases the held tasks
    assert Inspector(any_broker).limit_use(Q, {}) == [
        LimitUse(scope=QUEUE_SCOPE, limit=None, running=1, held=0, tokens=None),
        LimitUse(scope="a.pay", limit=None, running=1, held=2, tokens=None),
    ]


def test_held_tasks_of_types_not_named_are_found_type_by_type(any_broker: Broker):
    names = ["a.first", "b.second", "c.third", "d.fourth"]
    any_broker.limits = lambda: FlowLimits(
        types={name: Limit(max_concurrency=1) for name in names}, queues={}
    )
    for count, name in enumerate(names, start=2):
        add(any_broker, name, count)
    assert len(claim(any_broker)) == 4  # one of each type starts, the others are held

    records = Inspector(any_broker).limit_use(Q, {"b.second": Limit(max_concurrency=1)})
    assert [(r.scope, r.limit is not None, r.running, r.held) for r in records] == [
        ("a.first", False, 1, 1),
        ("b.second", True, 1, 2),
        ("c.third", False, 1, 3),
        ("d.fourth", False, 1, 4),
    ]


def test_a_queue_without_limits_or_use_has_no_records(broker: Broker):
    add(broker, "a.pay", 2)
    claim(broker)
    assert Inspector(broker).limit_use(Q, {}) == []


def test_a_task_says_whether_it_is_held_back(broker: Broker, inspector: Inspector):
    broker.limits = lambda: FlowLimits(types={"a.pay": Limit(max_concurrency=1)}, queues={})
    first, second = add(broker, "a.pay", 2)
    free = add(broker, "a.mail")[0]
    assert claim(broker) == [first, free]
    later = add(broker, "a.mail")[0]

    assert inspector.get_task(second).held and inspector.get_task(second).state == TaskState.PENDING
    assert not inspector.get_task(first).held and not inspector.get_task(later).held
    assert [(t.id, t.held) for t in inspector.list_tasks(Q, TaskState.PENDING)] == [
        (later, False),
        (second, True),
    ]
    assert [t.held for t in inspector.search_by_name(Q, TaskState.PENDING, "pay")] == [True]


# The operations layer


def test_a_queue_lists_its_own_limit_its_types_and_others_in_use_in_it(limited: Broker):
    ops = Operations()
    assert [(u.scope, u.limit) for u in ops.flow_control(Q)] == [
        (QUEUE_SCOPE, QUEUE_LIMIT),
        (PAY, PAY_LIMIT),
        (SEND, SEND_LIMIT),
    ]
    assert [(u.scope, u.limit) for u in ops.flow_control(OTHER_Q)] == [(REPORT, REPORT_LIMIT)]

    # a type of another queue enqueued here counts here, and is listed here while it is in use
    [report] = add(limited, REPORT, queue=Q)
    assert claim(limited) == [report]
    assert [(u.scope, u.running) for u in ops.flow_control(Q)] == [
        (QUEUE_SCOPE, 1),
        (PAY, 0),
        (REPORT, 1),
        (SEND, 0),
    ]
    assert ops.all_flow_control()[OTHER_Q] == ops.flow_control(OTHER_Q)


def test_a_held_task_says_which_limit_holds_it_back_and_its_use(limited: Broker, held, clock: FakeClock):
    ops = Operations()
    pay_task, send_task = ops.live_task(held[PAY][1]), ops.live_task(held[SEND][1])
    assert ops.held_reason(pay_task) == (
        f"Held back by the limits of its type {PAY} (at most 1 running): 1 running now, "
        "1 task of its type held back."
    )
    assert ops.held_reason(send_task) == (
        f"Held back by the limits of its type {SEND} (1/m): next start allowed in 1m 0s, "
        "1 task of its type held back."
    )
    clock.advance(45)
    assert "next start allowed in 15s" in ops.held_reason(ops.live_task(held[SEND][1]))

    limited.complete(Q, [done(held[PAY][0])], worker_id=WORKER)
    assert ops.held_reason(ops.live_task(held[PAY][1])) == (
        f"Held back by the limits of its type {PAY} (at most 1 running): 0 running now, "
        "1 task of its type held back. Its limits allow a start now: the next claim from the "
        "queue lets it run."
    )
    assert ops.held_reason(ops.live_task(held[SEND][0])) is None  # active: it started
    reasons = ops.held_reasons(ops.list_tasks(Q, TaskState.PENDING))
    assert set(reasons) == {held[PAY][1], held[SEND][1]}


def test_a_task_held_by_a_limit_since_removed_says_so(limited: Broker):
    limited.limits = lambda: FlowLimits(
        types={"a.gone": Limit(max_concurrency=1)}, queues={}
    )  # an earlier deploy
    _, waiting = add(limited, "a.gone", 2)
    claim(limited)
    ops = Operations()
    assert ops.held_reason(ops.live_task(waiting)) == (
        "Held back by a limit its type a.gone no longer has (the limits changed since): the next "
        "claim from the queue lets it run."
    )
    [gone] = [use for use in ops.flow_control(Q) if use.scope == "a.gone"]
    assert (gone.limit, gone.running, gone.held) == (None, 1, 1)


def test_reading_flow_control_needs_the_view_permission(limited: Broker, held):
    nobody = User.objects.create_user("nobody", is_staff=True)
    viewer = user_with("view_livetask", username="viewer")
    task = Operations().live_task(held[PAY][1])
    for read in (
        lambda ops: ops.flow_control(Q),
        lambda ops: ops.all_flow_control(),
        lambda ops: ops.held_reason(task),
    ):
        with pytest.raises(PermissionDenied, match="view_livetask"):
            read(Operations(nobody))
        assert read(Operations(viewer))


# The admin

DASHBOARD = "/admin/django_rtq/livetask/"


def text(response) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", response.content.decode()))


def flow_rows(response, queue: str) -> list[list[str]]:
    """The cells of each row of a queue's flow-control table on the dashboard, as text."""
    section = re.search(rf'data-flow-queue="{queue}">(.*?)</table>', response.content.decode(), re.S)
    assert section, f"no flow-control table for queue {queue!r}"
    rows = re.findall(r"<tr data-scope=[^>]*>(.*?)</tr>", section[1], re.S)
    return [
        [
            " ".join(html.unescape(re.sub(r"<[^>]+>", " ", cell)).split())
            for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)
        ]
        for row in rows
    ]


def test_the_dashboard_shows_each_queues_limits_held_tasks_and_use(
    limited: Broker, held, viewer_client: Client
):
    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 200
    assert flow_rows(response, Q) == [
        ["whole queue", "100/m (burst 10), at most 5 running", "2 of 5", "—", "8.0 of 10"],
        [PAY, "at most 1 running", "1 of 1", "1", "—"],
        [SEND, "1/m", "0", "1", "0.0 of 1 (next in 1m 0s)"],
    ]
    assert flow_rows(response, OTHER_Q) == [[REPORT, "at most 2 running", "0 of 2", "0", "—"]]
    held_link = reverse("admin:django_rtq_tasks", args=["pending"]) + f"?queue={Q}&amp;order=reverse"
    assert f'<a href="{held_link}">1</a>' in response.content.decode()


def test_the_dashboard_has_no_flow_control_table_for_a_queue_without_limits(
    broker: Broker, viewer_client: Client
):
    add(broker, "a.pay", 2)
    claim(broker)
    response = viewer_client.get(DASHBOARD)
    assert f'<tr data-queue="{Q}">' in response.content.decode()
    assert 'id="rtq-flow-control"' in response.content.decode()  # the auto-refresh's place
    assert f'data-flow-queue="{Q}"' not in response.content.decode()


def test_the_page_of_a_held_task_says_why_and_the_list_marks_it(limited: Broker, held, viewer_client: Client):
    url = reverse("admin:django_rtq_task", args=[held[PAY][1]]) + f"?queue={Q}"
    page = viewer_client.get(url)
    assert page.status_code == 200
    reason = re.search(
        r'<p class="rtq-held" id="rtq-held-reason"[^>]*>(.*?)</p>', page.content.decode(), re.S
    )
    assert reason and html.unescape(reason[1]) == Operations().held_reason(
        Operations().live_task(held[PAY][1])
    )

    running = viewer_client.get(reverse("admin:django_rtq_task", args=[held[PAY][0]]) + f"?queue={Q}")
    assert running.status_code == 200 and "rtq-held-reason" not in running.content.decode()

    listed = viewer_client.get(
        reverse("admin:django_rtq_tasks", args=["pending"]) + f"?queue={Q}"
    ).content.decode()
    marked = re.findall(r'<tr data-task-id="([^"]+)">(?:(?!</tr>).)*?class="rtq-held-mark"', listed, re.S)
    assert sorted(marked) == sorted([held[PAY][1], held[SEND][1]])


def test_staff_without_the_view_permission_see_no_flow_control(limited: Broker, held):
    client = logged_in(User.objects.create_user("staff", password="pw", is_staff=True))
    assert client.get(DASHBOARD).status_code == 403
    assert client.get(reverse("admin:django_rtq_task", args=[held[PAY][1]])).status_code == 403


# The API

API = "/rtq/api/"


def test_queues_in_the_api_have_their_limits_and_use(limited: Broker, held, reader_api: APIClient):
    expected = [
        {
            "scope": QUEUE_SCOPE,
            "task": None,
            "partition": None,
            "label": "whole queue",
            "limit": {
                "rate_limit": "100/m",
                "burst": 10,
                "max_concurrency": 5,
                "description": "100/m (burst 10), at most 5 running",
            },
            "running": 2,
            "held": 0,
            "tokens": 8.0,
        },
        {
            "scope": PAY,
            "task": PAY,
            "partition": None,
            "label": PAY,
            "limit": {
                "rate_limit": None,
                "burst": None,
                "max_concurrency": 1,
                "description": "at most 1 running",
            },
            "running": 1,
            "held": 1,
            "tokens": None,
        },
        {
            "scope": SEND,
            "task": SEND,
            "partition": None,
            "label": SEND,
            "limit": {"rate_limit": "1/m", "burst": 1, "max_concurrency": None, "description": "1/m"},
            "running": 0,
            "held": 1,
            "tokens": 0.0,
        },
    ]
    detail = reader_api.get(f"{API}queues/{Q}/")
    assert detail.status_code == 200
    assert detail.json()["limits"] == expected
    listed = {queue["queue"]: queue for queue in reader_api.get(f"{API}queues/").json()}
    assert listed[Q]["limits"] == expected
    assert [record["scope"] for record in listed[OTHER_Q]["limits"]] == [REPORT]
    add(limited, "a.free", queue="quiet")
    assert reader_api.get(f"{API}queues/quiet/").json()["limits"] == []


def test_a_task_in_the_api_says_why_it_is_held_back(limited: Broker, held, reader_api: APIClient):
    reason = Operations().held_reason(Operations().live_task(held[PAY][1]))
    assert reader_api.get(f"{API}tasks/{held[PAY][1]}/").json()["held_back"] == reason
    assert reader_api.get(f"{API}tasks/{held[PAY][0]}/").json()["held_back"] is None

    page = reader_api.get(f"{API}queues/{Q}/tasks/", {"state": "pending"}).json()
    assert {task["id"]: task["held_back"] is not None for task in page["results"]} == {
        held[PAY][1]: True,
        held[SEND][1]: True,
    }


def test_the_api_refuses_flow_control_without_the_view_permission(limited: Broker, held):
    client = APIClient()
    client.force_authenticate(User.objects.create_user("someone", is_staff=True))
    for path in (f"queues/{Q}/", "queues/", f"tasks/{held[PAY][1]}/"):
        assert client.get(API + path).status_code == 403, path


# rtq_stats


def run_stats(*args: str) -> str:
    out = io.StringIO()
    call_command("rtq_stats", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_rtq_stats_prints_each_queues_limits_and_use(limited: Broker, held):
    output = run_stats(Q)
    lines = output.split(f"Queue {Q!r}, flow control:\n", 1)[1].splitlines()
    assert [re.split(r"\s{2,}", line.strip()) for line in lines] == [
        ["SCOPE", "LIMIT", "RUNNING", "HELD BACK", "TOKENS NOW"],
        ["(whole queue)", "100/m (burst 10), at most 5 running", "2 of 5", "-", "8.0 of 10"],
        [PAY, "at most 1 running", "1 of 1", "1", "-"],
        [SEND, "1/m", "0", "1", "0.0 of 1"],
    ]
    add(limited, "a.free", queue="quiet")
    assert "flow control" not in run_stats("quiet")
    assert json.loads(run_stats("quiet", "--json"))["queues"][0]["limits"] == []


def test_rtq_stats_json_has_the_limits(limited: Broker, held):
    [queue] = json.loads(run_stats(Q, "--json"))["queues"]
    assert [(r["scope"], r["running"], r["held"], r["tokens"]) for r in queue["limits"]] == [
        (QUEUE_SCOPE, 2, 0, 8.0),
        (PAY, 1, 1, None),
        (SEND, 0, 1, 0.0),
    ]
    assert queue["limits"][1]["limit"] == {
        "rate_limit": None,
        "burst": None,
        "max_concurrency": 1,
        "description": "at most 1 running",
    }


def test_rtq_task_says_why_a_task_waits(limited: Broker, held):
    out = io.StringIO()
    call_command("rtq_task", held[PAY][1], stdout=out)
    assert f"Held back by the limits of its type {PAY} (at most 1 running): 1 running now" in out.getvalue()
    out = io.StringIO()
    call_command("rtq_task", held[PAY][1], "--json", stdout=out)
    assert json.loads(out.getvalue())["held_back"].startswith("Held back by the limits of its type")
    out = io.StringIO()
    call_command("rtq_task", held[PAY][0], "--json", stdout=out)
    assert json.loads(out.getvalue())["held_back"] is None


# Metrics


def test_the_metrics_have_each_scopes_running_and_held_tasks(limited: Broker, held, reader_api: APIClient):
    response = reader_api.get("/rtq/metrics/")
    assert response.status_code == 200
    samples = {
        family.name: {(s.labels["queue"], s.labels["scope"]): s.value for s in family.samples}
        for family in text_string_to_metric_families(response.content.decode())
        if family.name in ("rtq_limit_running", "rtq_limit_held")
    }
    samples = {
        name: {k: v for k, v in values.items() if k[0] in (Q, OTHER_Q)} for name, values in samples.items()
    }
    assert samples == {
        "rtq_limit_running": {(Q, QUEUE_SCOPE): 2, (Q, PAY): 1, (Q, SEND): 0, (OTHER_Q, REPORT): 0},
        "rtq_limit_held": {(Q, QUEUE_SCOPE): 0, (Q, PAY): 1, (Q, SEND): 1, (OTHER_Q, REPORT): 0},
    }


def test_the_metrics_refuse_a_user_without_the_view_permission(limited: Broker):
    client = APIClient()
    client.force_authenticate(User.objects.create_user("someone", is_staff=True))
    assert client.get("/rtq/metrics/").status_code == 403

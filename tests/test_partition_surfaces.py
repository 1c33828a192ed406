"""Fair partitions made visible (docs/partitions.md): each partition's limit and use, why a task
of a partition waits, and a task's partition, read through the operations layer by the admin, the
API, `rtq_stats` and the metrics (summed per type there: one series per tenant would not do)."""

from __future__ import annotations

import html
import io
import json
import re
import uuid

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from django_rtq import registry
from django_rtq.broker import Broker, TaskMessage
from django_rtq.broker.inspect import LimitUse
from django_rtq.broker.limits import QUEUE_SCOPE, partition_scope, scope_label, split_scope
from django_rtq.connection import get_broker
from django_rtq.flow_control import project_limits
from django_rtq.operations import Operations
from django_rtq.templatetags.rtq_admin import rtq_scope
from tests.support.clock import START_TIME, FakeClock
from tests.support.factories import WORKER, done, forget

pytestmark = pytest.mark.django_db

Q = "syncs"
#: Registered by the `partitioned` fixture: each partition at most one running, "premium" two.
SYNC = "tests.partsurf.sync"
API = "/rtq/api/"
DASHBOARD = "/admin/django_rtq/livetask/"


def sync(customer: str) -> None:
    return None


@pytest.fixture
def partitioned(prefix: str, clock: FakeClock):
    """The process's broker on a fake clock, with a partitioned type registered (taken out of the
    registry after the test)."""
    broker = get_broker()
    broker.clock = clock
    registry.task(
        name=SYNC,
        queue=Q,
        partition_by="customer",
        partition_max_concurrency=1,
        partition_limits={"premium": {"max_concurrency": 2}},
    )(sync)
    yield broker
    forget(SYNC)


def add(broker: Broker, partition: str | None, count: int = 1) -> list[str]:
    messages = [
        TaskMessage(id=uuid.uuid4().hex, task=SYNC, queue=Q, partition=partition, enqueued_at=START_TIME)
        for _ in range(count)
    ]
    broker.enqueue(messages)
    return [message.id for message in messages]


def finish_those_running(broker: Broker) -> None:
    """Claim, and complete the tasks that started: those held stay held until the next claim."""
    started = broker.claim(Q, worker_id=WORKER, limit=50)
    broker.complete(Q, [done(task.id) for task in started], worker_id=WORKER)


@pytest.fixture
def busy(partitioned: Broker) -> dict[str, list[str]]:
    """Tasks of partitions acme (2), beta (1) and premium (3) claimed: acme's first, beta's, and
    premium's first two run; the others are held back by their partition's limit."""
    ids = {
        "acme": add(partitioned, "acme", 2),
        "beta": add(partitioned, "beta"),
        "premium": add(partitioned, "premium", 3),
    }
    started = {task.id for task in partitioned.claim(Q, worker_id=WORKER, limit=10)}
    assert started == {ids["acme"][0], ids["beta"][0], *ids["premium"][:2]}
    return ids


# One readable form of a scope


@pytest.mark.parametrize(
    ("scope", "task", "partition", "label"),
    [
        (QUEUE_SCOPE, None, None, "whole queue"),
        ("crm.sync", "crm.sync", None, "crm.sync"),
        (partition_scope("crm.sync", "acme"), "crm.sync", "acme", "crm.sync · partition acme"),
        (partition_scope("crm.sync"), "crm.sync", "", "crm.sync · each partition"),
    ],
)
def test_a_scope_reads_as_its_task_and_partition(scope, task, partition, label):
    assert split_scope(scope) == (task, partition)
    assert scope_label(scope) == label
    use = LimitUse(scope=scope, limit=None, running=0, held=0, tokens=None)
    assert (use.task, use.partition, use.label) == (task, partition, label)


def test_the_admin_writes_a_scope_in_the_same_words_each_name_cut_to_its_box_and_escaped():
    written = rtq_scope(partition_scope("crm.sync", "a<b"))
    assert html.unescape(re.sub(r"<[^>]+>", "", written)) == scope_label(partition_scope("crm.sync", "a<b"))
    assert written.count('class="rtq-trunc"') == 2 and "a&lt;b" in written
    assert rtq_scope(QUEUE_SCOPE) == "whole queue"


# The operations layer


def uses(partitioned_queue: list[LimitUse]) -> list[tuple[str, str | None, int, int]]:
    return [
        (use.label, use.limit.describe() if use.limit else None, use.running, use.held)
        for use in partitioned_queue
    ]


def test_each_partition_in_use_has_its_limit_and_use(busy):
    assert uses(Operations().flow_control(Q)) == [
        (f"{SYNC} · each partition", "at most 1 running", 0, 0),
        (f"{SYNC} · partition acme", "at most 1 running", 1, 1),  # the type's for each partition
        (f"{SYNC} · partition beta", "at most 1 running", 1, 0),
        (f"{SYNC} · partition premium", "at most 2 running", 2, 1),  # its own
    ]


def test_a_partition_named_shows_its_limit_while_unused_and_others_only_in_use(partitioned: Broker):
    assert uses(Operations().flow_control(Q)) == [
        (f"{SYNC} · each partition", "at most 1 running", 0, 0),
        (f"{SYNC} · partition premium", "at most 2 running", 0, 0),
    ]
    assert Operations().flow_control("elsewhere") == []  # listed in the type's queue only


def test_a_partition_whose_bucket_refills_with_nothing_running_or_held_is_not_listed(
    partitioned: Broker, monkeypatch
):
    monkeypatch.setattr("django_rtq.broker.inspect.HELD_TYPES_SCAN", 0)  # a refilling bucket is in use
    forget(SYNC)
    registry.task(name=SYNC, queue=Q, partition_by="customer", partition_rate_limit="1/h")(sync)
    (task_id,) = add(partitioned, "acme")
    assert [task.id for task in partitioned.claim(Q, worker_id=WORKER, limit=10)] == [task_id]
    partitioned.complete(Q, [done(task_id)], worker_id=WORKER)

    [acme] = [
        use
        for use in Operations().inspector.limit_use(Q, project_limits().for_queue(Q))
        if use.partition and use.task == SYNC
    ]
    assert (acme.partition, acme.running, acme.held, acme.tokens) == ("acme", 0, 0, 0.0)  # in Redis
    assert uses(Operations().flow_control(Q)) == [(f"{SYNC} · each partition", "1/h", 0, 0)]

    add(partitioned, "acme")
    assert partitioned.claim(Q, worker_id=WORKER, limit=10) == []  # held: its bucket is empty
    assert uses(Operations().flow_control(Q))[1] == (f"{SYNC} · partition acme", "1/h", 0, 1)


def test_a_task_held_by_its_partition_says_so(busy, partitioned: Broker):
    ops = Operations()
    assert ops.held_reason(ops.live_task(busy["acme"][1])) == (
        f"Held back by the limits of its partition acme of {SYNC} (at most 1 running): 1 running "
        "now, 1 task of its partition held back."
    )
    assert ops.held_reason(ops.live_task(busy["premium"][2])) == (
        f"Held back by the limits of its partition premium of {SYNC} (at most 2 running): 2 running "
        "now, 1 task of its partition held back."
    )
    assert ops.held_reason(ops.live_task(busy["beta"][0])) is None  # running


def test_a_task_held_by_a_partition_past_those_walked_says_so(partitioned: Broker, monkeypatch):
    monkeypatch.setattr("django_rtq.broker.inspect.HELD_TYPES_SCAN", 1)
    held = {customer: add(partitioned, customer, 2)[1] for customer in ("a", "b", "c")}
    finish_those_running(partitioned)  # held only now, until the next claim: found by the walk
    ops = Operations()
    assert len([use for use in ops.flow_control(Q) if use.held]) == 1  # one partition walked
    for customer, task_id in held.items():
        assert ops.held_reason(ops.live_task(task_id)) == (
            f"Held back by the limits of its partition {customer} of {SYNC} (at most 1 running): 0 "
            "running now, 1 task of its partition held back. Its limits allow a start now: the next "
            "claim from the queue lets it run."
        )


def test_the_held_tasks_of_partitions_in_use_are_counted_without_the_walk(partitioned: Broker, monkeypatch):
    monkeypatch.setattr("django_rtq.broker.inspect.HELD_TYPES_SCAN", 0)
    for customer in ("a", "b", "c"):
        add(partitioned, customer, 3)
    partitioned.claim(Q, worker_id=WORKER, limit=20)
    listed = [(use.partition, use.running, use.held) for use in Operations().flow_control(Q) if use.partition]
    assert listed == [("a", 1, 2), ("b", 1, 2), ("c", 1, 2), ("premium", 0, 0)]


# The admin


def flow_rows(response, queue: str) -> list[list[str]]:
    """The cells of each row of a queue's flow-control table on the dashboard, as text."""
    section = re.search(rf'data-flow-queue="{queue}">(.*?)</table>', response.content.decode(), re.S)
    assert section, f"no flow-control table for queue {queue!r}"
    rows = re.findall(r"<tr data-(?:scope|task)=[^>]*>(.*?)</tr>", section[1], re.S)
    return [
        [
            " ".join(html.unescape(re.sub(r"<[^>]+>", " ", cell)).split())
            for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)
        ]
        for row in rows
    ]


def test_the_dashboard_lists_each_partition_in_use(busy, viewer_client: Client):
    response = viewer_client.get(DASHBOARD)
    assert response.status_code == 200
    assert flow_rows(response, Q) == [
        [f"{SYNC} · each partition", "at most 1 running", "per partition"],
        [f"{SYNC} · partition acme", "at most 1 running", "1 of 1", "1", "—"],
        [f"{SYNC} · partition beta", "at most 1 running", "1 of 1", "0", "—"],
        [f"{SYNC} · partition premium", "at most 2 running", "2 of 2", "1", "—"],
    ]
    page = response.content.decode()
    assert f'data-task="{SYNC}" data-partition="acme"' in page
    assert "\x02" not in page  # the scopes' separator is never written in the page


def test_the_page_of_a_task_shows_its_partition_and_why_it_waits(busy, viewer_client: Client):
    page = viewer_client.get(reverse("admin:django_rtq_task", args=[busy["acme"][1]])).content.decode()
    row = re.search(r'<tr id="rtq-partition"><th>Partition</th><td>(.*?)</td>', page)
    assert row and row[1] == "acme"
    reason = re.search(r'id="rtq-held-reason"[^>]*>(.*?)</p>', page, re.S)
    assert reason and html.unescape(reason[1]).startswith(
        f"Held back by the limits of its partition acme of {SYNC}"
    )


def test_the_page_of_a_task_without_a_partition_has_no_partition_row(
    partitioned: Broker, viewer_client: Client
):
    (plain,) = add(partitioned, None)
    page = viewer_client.get(reverse("admin:django_rtq_task", args=[plain])).content.decode()
    assert page.count('id="rtq-task-id"') == 1 and 'id="rtq-partition"' not in page


def test_the_task_list_finds_the_tasks_of_a_partition(busy, partitioned: Broker, viewer_client: Client):
    add(partitioned, "acme-two")  # a name that "acme" is the start of: not of partition acme
    url = reverse("admin:django_rtq_tasks", args=["pending"])

    def listed(**query) -> tuple[list[str], str]:
        page = viewer_client.get(url, {"queue": Q, **query}).content.decode()
        return re.findall(r'<tr data-task-id="([^"]+)">', page), page

    found, page = listed(partition="acme")
    assert found == [busy["acme"][1]]
    assert "tasks are of partition “acme”" in html.unescape(page)
    assert listed(partition="premium", name="partsurf")[0] == [busy["premium"][2]]
    assert listed(partition="premium", name="other")[0] == []
    assert len(listed()[0]) == 3


# The API


def test_a_queue_in_the_api_lists_its_partitions_scopes(busy, reader_api: APIClient):
    limits = reader_api.get(f"{API}queues/{Q}/").json()["limits"]
    assert [(r["scope"], r["task"], r["partition"], r["label"], r["running"], r["held"]) for r in limits] == [
        (partition_scope(SYNC), SYNC, "", f"{SYNC} · each partition", 0, 0),
        (partition_scope(SYNC, "acme"), SYNC, "acme", f"{SYNC} · partition acme", 1, 1),
        (partition_scope(SYNC, "beta"), SYNC, "beta", f"{SYNC} · partition beta", 1, 0),
        (partition_scope(SYNC, "premium"), SYNC, "premium", f"{SYNC} · partition premium", 2, 1),
    ]
    assert limits[3]["limit"]["max_concurrency"] == 2


def test_a_task_in_the_api_has_its_partition(busy, partitioned: Broker, reader_api: APIClient):
    body = reader_api.get(f"{API}tasks/{busy['acme'][1]}/").json()
    assert body["partition"] == "acme"
    assert body["held_back"].startswith(f"Held back by the limits of its partition acme of {SYNC}")
    (plain,) = add(partitioned, None)
    assert reader_api.get(f"{API}tasks/{plain}/").json()["partition"] is None
    page = reader_api.get(f"{API}queues/{Q}/tasks/", {"state": "pending"}).json()
    assert {task["id"]: task["partition"] for task in page["results"]} == {
        busy["acme"][1]: "acme",
        busy["premium"][2]: "premium",
        plain: None,
    }


# rtq_stats


def run_stats(*args: str) -> str:
    out = io.StringIO()
    call_command("rtq_stats", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_rtq_stats_prints_each_partition_readably(busy):
    output = run_stats(Q)
    lines = output.split(f"Queue {Q!r}, flow control:\n", 1)[1].splitlines()
    assert [re.split(r"\s{2,}", line.strip()) for line in lines[:5]] == [
        ["SCOPE", "LIMIT", "RUNNING", "HELD BACK", "TOKENS NOW"],
        [f"{SYNC} · each partition", "at most 1 running", "-", "-", "-"],
        [f"{SYNC} · partition acme", "at most 1 running", "1 of 1", "1", "-"],
        [f"{SYNC} · partition beta", "at most 1 running", "1 of 1", "0", "-"],
        [f"{SYNC} · partition premium", "at most 2 running", "2 of 2", "1", "-"],
    ]
    assert "\x02" not in output
    [queue] = json.loads(run_stats(Q, "--json"))["queues"]
    assert [(r["task"], r["partition"], r["held"]) for r in queue["limits"]] == [
        (SYNC, "", 0),
        (SYNC, "acme", 1),
        (SYNC, "beta", 0),
        (SYNC, "premium", 1),
    ]


def test_rtq_task_shows_the_partition_and_why_it_waits(busy):
    out = io.StringIO()
    call_command("rtq_task", busy["acme"][1], "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["held_back"].startswith(f"Held back by the limits of its partition acme of {SYNC}")
    out = io.StringIO()
    call_command("rtq_task", busy["acme"][1], stdout=out)
    assert re.search(r"^partition:\s+acme$", out.getvalue(), re.M)


# Metrics


def scraped(client: APIClient) -> dict[str, dict[tuple[str, ...], float]]:
    response = client.get("/rtq/metrics/")
    assert response.status_code == 200
    return {
        family.name: {tuple(s.labels.values()): s.value for s in family.samples if s.labels.get("queue") == Q}
        for family in text_string_to_metric_families(response.content.decode())
        if family.name.startswith("rtq_limit_")
    }


def test_the_metrics_sum_the_partitions_per_type_with_no_series_per_partition(busy, reader_api: APIClient):
    assert scraped(reader_api) == {
        "rtq_limit_running": {},  # no scope of a partition, nor of the limits each has
        "rtq_limit_held": {},
        "rtq_limit_partitions_running": {(Q, SYNC): 4},
        "rtq_limit_partitions_held": {(Q, SYNC): 2},
    }


def test_the_metrics_count_every_partitions_held_tasks_past_the_scopes_listed(
    partitioned: Broker, reader_api: APIClient, monkeypatch
):
    monkeypatch.setattr("django_rtq.broker.inspect.HELD_TYPES_SCAN", 2)
    for customer in ("a", "b", "c", "d"):
        add(partitioned, customer, 3)
    finish_those_running(partitioned)  # two of each held, none running: found by the walk

    listed = [use for use in Operations().flow_control(Q) if use.partition]
    assert sum(use.held for use in listed) == 4  # the two partitions walked
    families = scraped(reader_api)
    assert families["rtq_limit_partitions_held"] == {(Q, SYNC): 8}
    assert families["rtq_limit_partitions_running"] == {(Q, SYNC): 0}


def test_a_queue_without_partitioned_types_has_no_partition_series(
    partitioned: Broker, reader_api: APIClient
):
    add(partitioned, "acme")
    response = reader_api.get("/rtq/metrics/")
    samples = [
        s.labels
        for family in text_string_to_metric_families(response.content.decode())
        if family.name.startswith("rtq_limit_partitions")
        for s in family.samples
    ]
    ours = [labels for labels in samples if labels["task"] == SYNC]
    assert ours and all(labels == {"queue": Q, "task": SYNC} for labels in ours)


def test_the_metrics_keep_a_types_own_scope_apart_from_its_partitions(
    partitioned: Broker, reader_api: APIClient
):
    forget(SYNC)
    registry.task(
        name=SYNC, queue=Q, max_concurrency=3, partition_by="customer", partition_max_concurrency=1
    )(sync)
    add(partitioned, "acme", 2)
    add(partitioned, "beta", 2)
    partitioned.claim(Q, worker_id=WORKER, limit=10)
    families = scraped(reader_api)
    assert families["rtq_limit_running"] == {(Q, SYNC): 2}
    assert families["rtq_limit_partitions_running"] == {(Q, SYNC): 2}
    assert families["rtq_limit_partitions_held"] == {(Q, SYNC): 2}

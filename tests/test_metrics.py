"""The Prometheus endpoint (django_rtq.metrics) on the real Redis: access, and every series' value."""

from __future__ import annotations

import base64
import importlib

import prometheus_client
import pytest
from django.contrib.auth.models import Permission, User
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from django_rtq.broker import Broker, TaskState
from django_rtq.connection import reset_broker
from django_rtq.metrics.collector import STATES
from tests.support.clock import START_TIME, FakeClock
from tests.support.factories import BILLING, EMAILS, make_tasks
from tests.support.polling import wait_for
from tests.testapp import tasks
from tests.testapp.tasks import report_key

pytestmark = pytest.mark.django_db

URL = "/rtq/metrics/"
#: What Prometheus 2.x sends when it scrapes.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
BASIC_AUTH = {"API_AUTHENTICATION_CLASSES": ["rest_framework.authentication.BasicAuthentication"]}


@pytest.fixture
def basic_auth(settings, prefix):
    """The API (and so the metrics) authenticate with HTTP basic auth, as a scraper would."""
    settings.RTQ = {**settings.RTQ, **BASIC_AUTH}
    # Basic auth checks the password at every request: a fast hasher keeps the tests quick.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def scraper(django_user_model) -> User:
    """A user with the permission to look at live state, and nothing else."""
    user = django_user_model.objects.create_user("prometheus", password="scrape")
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="django_rtq", codename="view_livetask")
    )
    return user


def credentials(username: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"HTTP_AUTHORIZATION": f"Basic {token}"}


def scrape(client, **headers) -> dict[str, list[Sample]]:
    """Scrape as the scraper user (basic auth); return the samples by metric family name."""
    response = client.get(URL, **credentials("prometheus", "scrape"), **headers)
    assert response.status_code == 200, response.content
    return families(response.content.decode())


def families(text: str) -> dict[str, list[Sample]]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def by_label(samples: list[Sample], label: str, name: str | None = None) -> dict[str, float]:
    return {s.labels[label]: s.value for s in samples if name is None or s.name == name}


# Access


def test_anonymous_scrapes_are_refused_as_by_the_api(prefix, client, settings):
    assert client.get(URL).status_code == 403  # DRF's default: session authentication first

    settings.RTQ = {**settings.RTQ, **BASIC_AUTH}
    response = client.get(URL, HTTP_ACCEPT=PROMETHEUS_ACCEPT)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Basic")
    assert b"rtq_tasks" not in response.content


def test_a_user_without_the_permission_is_refused(basic_auth, client, django_user_model):
    django_user_model.objects.create_user("nobody", password="pw", is_staff=True)
    response = client.get(URL, **credentials("nobody", "pw"))
    assert response.status_code == 403
    assert "django_rtq.view_livetask" in response.json()["detail"]
    assert client.get(URL, **credentials("prometheus", "wrong")).status_code == 401


def test_a_user_with_the_permission_scrapes_in_the_format_asked_for(basic_auth, client, scraper):
    response = client.get(URL, **credentials("prometheus", "scrape"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert response["Cache-Control"] == "no-store"
    assert "rtq_workers 0.0" in response.content.decode()

    response = client.get(URL, **credentials("prometheus", "scrape"), HTTP_ACCEPT=PROMETHEUS_ACCEPT)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    parsed = {f.name: f for f in openmetrics_families(response.content.decode())}
    assert parsed["rtq_tasks_processed"].type == "counter" and parsed["rtq_workers"].samples[0].value == 0


def test_the_configured_permission_classes_are_the_policy(prefix, client, settings):
    settings.RTQ = {**settings.RTQ, "API_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"]}
    response = client.get(URL)
    assert response.status_code == 200
    assert "rtq_redis_up" in families(response.content.decode())


def test_importing_the_metrics_registers_nothing_globally():
    importlib.import_module("django_rtq.metrics.urls")  # and with it the view and the collector
    names = {metric.name for metric in prometheus_client.REGISTRY.collect()}
    assert not [name for name in names if name.startswith("rtq_")]


# Queues


def test_sizes_by_state_paused_and_the_age_of_the_oldest_pending_task(
    basic_auth, client, scraper, broker: Broker, clock: FakeClock
):
    broker.clock = clock
    made = {  # pending last: make_tasks claims what it made for the other states
        TaskState.SCHEDULED: 2,
        TaskState.RETRY: 1,
        TaskState.ARCHIVED: 2,
        TaskState.COMPLETED: 1,
        TaskState.WAITING: 1,
        TaskState.PENDING: 3,
    }
    for state, count in made.items():
        make_tasks(broker, state, EMAILS, count)
    make_tasks(broker, TaskState.ACTIVE, BILLING, 2)
    broker.pause(BILLING)
    clock.advance(90)

    metrics = scrape(client)

    sizes = {(s.labels["queue"], s.labels["state"]): s.value for s in metrics["rtq_tasks"]}
    for state in STATES:
        assert sizes[(EMAILS, str(state))] == made.get(state, 0), state
        assert sizes[(BILLING, str(state))] == (2 if state == TaskState.ACTIVE else 0), state
    # Every known queue is listed, those of settings.RTQ["QUEUES"] too, even when empty.
    assert {queue for queue, _ in sizes} == {EMAILS, BILLING, "default", "low"}
    assert by_label(metrics["rtq_queue_paused"], "queue") == {EMAILS: 0, BILLING: 1, "default": 0, "low": 0}
    ages = by_label(metrics["rtq_queue_oldest_pending_age_seconds"], "queue")
    assert ages == {EMAILS: 90.0, BILLING: 0.0, "default": 0.0, "low": 0.0}


def test_processed_and_failed_are_todays_counters_started_at_midnight_utc(
    basic_auth, client, scraper, broker: Broker, clock: FakeClock
):
    broker.clock = clock
    make_tasks(broker, TaskState.COMPLETED, EMAILS, 4)
    make_tasks(broker, TaskState.RETRY, EMAILS, 2)
    make_tasks(broker, TaskState.ARCHIVED, BILLING, 1)

    metrics = scrape(client)

    processed = metrics["rtq_tasks_processed"]
    assert by_label(processed, "queue", "rtq_tasks_processed_total") == {
        EMAILS: 6, BILLING: 1, "default": 0, "low": 0
    }  # fmt: skip
    assert by_label(metrics["rtq_tasks_failed"], "queue", "rtq_tasks_failed_total") == {
        EMAILS: 2, BILLING: 1, "default": 0, "low": 0
    }  # fmt: skip
    midnight = START_TIME // 86400 * 86400
    # In the text format the start of a counter is a gauge of its own, `<name>_created`.
    assert set(by_label(metrics["rtq_tasks_processed_created"], "queue").values()) == {midnight}
    assert set(by_label(metrics["rtq_tasks_failed_created"], "queue").values()) == {midnight}

    clock.advance(86400)  # the next UTC day: the counters start again from zero
    metrics = scrape(client)
    assert set(by_label(metrics["rtq_tasks_processed"], "queue", "rtq_tasks_processed_total").values()) == {0}
    assert set(by_label(metrics["rtq_tasks_processed_created"], "queue").values()) == {midnight + 86400}


def test_counters_follow_what_a_worker_did(basic_auth, client, scraper, run_worker, inspector):
    retried = tasks.flaky.using(retention=60).enqueue("flaky", 2)
    with run_worker():
        wait_for(lambda: inspector.get_task(retried.id).state == TaskState.COMPLETED)

    metrics = scrape(client)

    assert by_label(metrics["rtq_tasks_processed"], "queue", "rtq_tasks_processed_total")["default"] == 3
    assert by_label(metrics["rtq_tasks_failed"], "queue", "rtq_tasks_failed_total")["default"] == 2
    sizes = {(s.labels["queue"], s.labels["state"]): s.value for s in metrics["rtq_tasks"]}
    assert sizes[("default", "completed")] == 1 and sizes[("default", "pending")] == 0


# Run times and waits per task type


def test_run_times_and_waits_per_task_type_follow_what_a_worker_did(
    basic_auth, client, scraper, run_worker, inspector
):
    retried = tasks.flaky.using(retention=60).enqueue("timed", 2)  # fails twice, then succeeds
    added = [tasks.add.using(retention=60).enqueue(i, i) for i in range(3)]
    with run_worker():
        for message in [retried, *added]:
            wait_for(lambda message=message: inspector.get_task(message.id).state == TaskState.COMPLETED)
        # The settler adds its counts to Redis within a second of the last task.
        wait_for(lambda: _count(scrape(client), "tests.testapp.tasks.flaky", "success") == 1)

    metrics = scrape(client)
    for task, outcome, count in [
        ("tests.testapp.tasks.flaky", "success", 1),
        ("tests.testapp.tasks.flaky", "failure", 2),
        ("tests.testapp.tasks.add", "success", 3),
    ]:
        assert _count(metrics, task, outcome) == count
        buckets = [
            s
            for s in metrics["rtq_task_duration_seconds"]
            if s.name.endswith("_bucket") and s.labels["task"] == task and s.labels["outcome"] == outcome
        ]
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == count
        assert [b.value for b in buckets] == sorted(b.value for b in buckets)  # cumulative
    waits = {
        s.labels["task"]: s.value
        for s in metrics["rtq_task_queue_latency_seconds"]
        if s.name.endswith("_count")
    }
    # Only first attempts count a wait: the two retries of `flaky` waited for their backoff.
    assert waits == {"tests.testapp.tasks.flaky": 1, "tests.testapp.tasks.add": 3}
    assert inspector.task_timings("low") == ([], [])


def _count(metrics, task: str, outcome: str) -> float | None:
    for sample in metrics.get("rtq_task_duration_seconds", []):
        if (
            sample.name.endswith("_count")
            and sample.labels["task"] == task
            and sample.labels["outcome"] == outcome
        ):
            return sample.value
    return None


# Workers


def test_workers_alive_their_threads_running_tasks_and_consumers_per_queue(
    basic_auth, client, scraper, run_worker, redis_client
):
    assert scrape(client)["rtq_workers"][0].value == 0
    tasks.block.enqueue("metrics-worker")
    with run_worker(queues={"default": 2, "low": 1}, concurrency=3), run_worker(concurrency=2):
        wait_for(lambda: redis_client.lrange(report_key("metrics-worker:started"), 0, -1))
        metrics = wait_for(lambda: _with_workers(client, 2))
        assert metrics["rtq_worker_threads"][0].value == 5
        assert by_label(metrics["rtq_queue_workers"], "queue") == {"default": 2, "low": 1}
        wait_for(lambda: scrape(client)["rtq_worker_running_tasks"][0].value == 1)
        redis_client.set(report_key("release:metrics-worker"), "1")
        wait_for(lambda: scrape(client)["rtq_worker_running_tasks"][0].value == 0)
    assert scrape(client)["rtq_workers"][0].value == 0  # a stopped worker leaves the registry


def _with_workers(client, count: int) -> dict[str, list[Sample]] | None:
    metrics = scrape(client)
    return metrics if metrics["rtq_workers"][0].value == count else None


# Redis away


def test_a_scrape_while_redis_is_away_says_so_instead_of_failing(basic_auth, client, scraper, settings):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens there
    reset_broker()
    try:
        metrics = scrape(client)
    finally:
        reset_broker()
    assert metrics["rtq_redis_up"][0].value == 0
    assert "rtq_tasks" not in metrics

"""Where flow-control limits come from: `@task` options (django-rtq's and Django's own through the
backend), `RTQ["QUEUE_LIMITS"]`, their validation, and how the project's broker applies them."""

from __future__ import annotations

import json
import logging
import re
import uuid

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from django_rtq import registry
from django_rtq.broker import TaskMessage, TaskState
from django_rtq.broker.limits import QUEUE_SCOPE, Limit
from django_rtq.checks import TAG
from django_rtq.conf import get_settings
from django_rtq.connection import get_broker
from django_rtq.exceptions import InvalidTask
from django_rtq.flow_control import project_limits
from django_rtq.worker.processor.fetcher import holds
from tests.support.factories import forget
from tests.support.polling import wait_for
from tests.testapp import tasks

try:
    from django.tasks import task as django_task
except ImportError:
    from django_tasks import task as django_task


@pytest.fixture
def registered():
    """Task types a test registers, taken out of the registry again after it."""
    names: list[str] = []

    def add(name: str, func=lambda: None, **options):
        task_type = registry.task(name=name, **options)(func)
        names.append(name)
        return task_type

    yield add
    for name in names:
        forget(name)


def test_a_task_types_limits_apply_in_every_queue_and_follow_new_registrations(registered):
    before = project_limits()
    assert "tests.flow.paid" not in before.types
    registered("tests.flow.paid", rate_limit="20/s", burst=40, max_concurrency=3)
    limits = project_limits()
    assert limits is not before
    assert limits.types["tests.flow.paid"] == Limit(rate=20, period=1.0, burst=40, max_concurrency=3)
    assert json.loads(limits.spec("anything"))["tests.flow.paid"] == {"r": 20, "p": 1000, "b": 40, "c": 3}
    assert project_limits() is limits  # kept until the registry or the settings change


def test_queue_limits_come_from_settings(settings):
    settings.RTQ = {
        **settings.RTQ,
        "QUEUE_LIMITS": {"payments": {"rate_limit": "100/m", "max_concurrency": 5}},
    }
    assert {"payments": Limit(rate=100, period=60.0, max_concurrency=5)} == get_settings().QUEUE_LIMITS
    limits = project_limits()
    assert limits.for_queue("payments")[QUEUE_SCOPE] == Limit(rate=100, period=60.0, max_concurrency=5)
    assert QUEUE_SCOPE not in limits.for_queue("default")
    assert limits.holds("payments", "any.task") and not limits.holds("default", "any.task")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([("payments", {})], "must be a dict of queue name -> limits"),
        ({"payments": {"rate": "1/s"}}, "must be a dict of some of rate_limit, burst, max_concurrency"),
        ({"payments": {}}, "must be a dict of some of"),
        ({"payments": {"rate_limit": "fast"}}, "['payments']: rate_limit must be a string like '20/s'"),
        ({"pay:ments": {"max_concurrency": 1}}, "Queue name 'pay:ments' is invalid"),
    ],
)
def test_wrong_queue_limits_are_refused_at_start_up(settings, value, message):
    settings.RTQ = {**settings.RTQ, "QUEUE_LIMITS": value}
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        get_settings()


def test_wrong_task_limits_are_refused_where_the_task_is_defined(registered):
    with pytest.raises(ImproperlyConfigured, match=r"Task 'tests.flow.bad': rate_limit must be"):
        registered("tests.flow.bad", rate_limit="20 per second")
    assert registry.get_task_type("tests.flow.bad") is None


@pytest.mark.parametrize("name", ["*", "shop.tasks.pay\0", "a\1b"])
def test_a_name_the_claim_could_not_tell_apart_cannot_have_limits(registered, name):
    with pytest.raises(ImproperlyConfigured, match="cannot have flow-control limits"):
        registered(name, max_concurrency=1)


def test_limits_belong_to_the_task_type_not_to_one_call(registered):
    task_type = registered("tests.flow.typed", max_concurrency=1)
    with pytest.raises(InvalidTask, match=r"Unknown option.*'max_concurrency'"):
        task_type.using(max_concurrency=5)


def plain_function():
    return None


def test_djangos_own_task_takes_the_limits_through_the_backend():
    limited = django_task(rate_limit="5/m", max_concurrency=2)(plain_function)
    try:
        assert project_limits().types[limited.module_path] == Limit(rate=5, period=60.0, max_concurrency=2)
    finally:
        forget(limited.module_path)
    with pytest.raises(ImproperlyConfigured, match="max_concurrency must be a positive whole number"):
        django_task(max_concurrency=-1)(plain_function)


def test_the_projects_broker_hands_no_limited_task_to_an_idle_worker(settings, prefix, registered):
    registered("tests.flow.handed", max_concurrency=5)
    broker = get_broker()
    queue = broker.queue("default")
    broker.claim("default", worker_id="idle-worker", limit=1, idle_for_ms=60_000)
    pubsub = broker.client.pubsub()
    pubsub.subscribe(queue.handoff_prefix + "idle-worker")
    try:
        message = TaskMessage(id=uuid.uuid4().hex, task="tests.flow.handed", queue="default")
        broker.enqueue([message])
        assert broker.client.hget(queue.state, message.id) == TaskState.PENDING
    finally:
        pubsub.close()


def test_a_worker_gives_back_a_limited_task_handed_to_it_by_an_older_deploy(registered):
    registered("tests.flow.guarded", max_concurrency=1)
    limits = project_limits()
    assert holds(limits, "default", json.dumps({"task": "tests.flow.guarded"}))
    assert not holds(limits, "default", json.dumps({"task": "tests.noop"}))
    assert not holds(limits, "default", "not json")


def test_a_handed_task_is_held_by_the_type_it_names_however_its_message_is_written(settings, registered):
    """The stored form's leading name is read without parsing the message; any other form is parsed."""
    registered("tests.flow.guarded", max_concurrency=1)
    settings.RTQ = {**settings.RTQ, "QUEUE_LIMITS": {"payments": {"max_concurrency": 1}}}
    limits = project_limits()
    guarded = TaskMessage(id="a", task="tests.flow.guarded", queue="default").to_json()
    plain = TaskMessage(id="a", task="tests.noop", queue="default").to_json()
    assert guarded.startswith('{"task":"tests.flow.guarded"')
    assert holds(limits, "default", guarded) and not holds(limits, "default", plain)
    assert holds(limits, "default", '{"task":"tests.flow.gu\\u0061rded"}')  # an escape: parsed
    assert holds(limits, "default", '{"id":"a","task":"tests.flow.guarded"}')  # an earlier form
    assert holds(limits, "payments", plain)  # its queue's limits
    assert not holds(limits, "payments", '{"task":"tests.noop",')  # corrupt: archived, as ever


def test_a_queue_limit_on_a_queue_named_nowhere_is_a_likely_typo(settings):
    settings.RTQ = {**settings.RTQ, "QUEUE_LIMITS": {"paymnts": {"max_concurrency": 1}}}
    warnings = [m for m in run_checks(tags=[TAG]) if m.id == "django_rtq.W007"]
    assert len(warnings) == 1 and "'paymnts'" in warnings[0].msg
    settings.RTQ = {**settings.RTQ, "QUEUE_LIMITS": {"default": {"max_concurrency": 1}}}
    assert not [m for m in run_checks(tags=[TAG]) if m.id == "django_rtq.W007"]


def test_a_worker_claims_again_as_soon_as_a_thread_frees_for_tasks_its_limits_let_start(
    settings, broker, run_worker, registered, redis_client
):
    # Limited tasks are never prefetched: a claim leaves them for a free thread. Waiting for a
    # wake-up instead would take IDLE_WAIT per claim of two tasks.
    settings.RTQ = {**settings.RTQ, "IDLE_WAIT": 30}
    bursty = registered("tests.flow.bursty", tasks.record, rate_limit="1000/s", burst=20)
    for _ in range(20):
        bursty.enqueue("bursty")
    with run_worker(concurrency=2):
        wait_for(lambda: redis_client.llen(tasks.report_key("bursty")) == 20, timeout=10, message="20 runs")


def test_tasks_claimed_before_their_types_limits_were_known_are_given_back(broker, run_worker, caplog):
    name = "tests.testapp.late_limits.one_at_a_time"
    assert registry.get_task_type(name) is None  # its module is not a tasks module: not imported yet
    caplog.set_level(logging.INFO, logger="django_rtq")
    messages = [TaskMessage(id=uuid.uuid4().hex, task=name, queue="default", args=["late"]) for _ in range(6)]
    broker.enqueue(messages)
    try:
        with run_worker(concurrency=4):
            wait_for(lambda: redis_client_len(broker, "late") == 6, timeout=20, message="6 runs")
        runs = [json.loads(raw) for raw in broker.client.lrange(tasks.report_key("late"), 0, -1)]
        assert max(run["running"] for run in runs) == 1  # its limit held from its first task on
        assert "claimed before their type's limits were known" in caplog.text
    finally:
        forget(name)


def redis_client_len(broker, name: str) -> int:
    return broker.client.llen(tasks.report_key(name))

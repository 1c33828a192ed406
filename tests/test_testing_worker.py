"""The testing helpers that run workers: a burst worker on the real Redis, and fakeredis mode."""

from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_rtq import get_broker, task
from django_rtq.broker.inspect import Inspector
from django_rtq.testing import BurstTimeout, capture_tasks, run_worker_burst, use_fake_redis
from django_rtq.testing import fake as fake_module

#: Set to let `wait_for_release` return.
released = threading.Event()
attempts: dict[str, int] = {}


@pytest.fixture(autouse=True)
def fresh_state():
    released.clear()
    attempts.clear()
    yield
    released.set()


@task(retention=60)
def total(*numbers):
    return sum(numbers)


@task(max_retries=1)
def fails_once(name):
    attempts[name] = attempts.get(name, 0) + 1
    if attempts[name] == 1:
        raise RuntimeError("first attempt fails")
    return attempts[name]


@task(max_retries=0)
def always_fails():
    raise ValueError("never works")


@task(retention=60)
def fan_out(count):
    total.enqueue(*range(count))
    return count


@task(max_retries=0)
def wait_for_release():
    # Short waits, so that the worker's shutdown can interrupt it between two.
    for _ in range(3000):
        if released.wait(0.01):
            return "released"
    return "gave up"


# A burst worker on the real Redis


def test_a_burst_runs_the_queues_until_drained_and_counts_outcomes(prefix, inspector):
    ok = total.enqueue(1, 2, 3)
    flaky = fails_once.enqueue("a")
    broken = always_fails.enqueue()
    fan_out.enqueue(3)

    summary = run_worker_burst()

    assert (summary.succeeded, summary.retried, summary.archived, summary.failed) == (4, 1, 1, 2)
    assert summary.results[ok.id] == 6
    assert summary.results[flaky.id] == 2
    assert str(summary.errors[broken.id]) == "never works"
    stats = inspector.queue_stats("default")
    assert (stats.pending, stats.retry, stats.active, stats.archived) == (0, 0, 0, 1)
    assert stats.completed == 3  # total twice and fan_out keep their results; fails_once does not
    assert inspector.get_task(ok.id).result == 6


def test_a_burst_on_other_queues_leaves_the_rest(prefix, inspector):
    elsewhere = total.using(queue="other").enqueue(1)
    here = total.enqueue(2)

    summary = run_worker_burst(queues=["default"], concurrency=2)

    assert summary.results == {here.id: 2}
    assert inspector.get_task(elsewhere.id).state == "pending"


def test_a_burst_that_cannot_drain_in_time_is_stopped_and_says_so(prefix, inspector):
    stuck = wait_for_release.enqueue()
    threads_before = set(threading.enumerate())

    with pytest.raises(BurstTimeout, match=r"did not drain queues default, low within 0.3s"):
        run_worker_burst(timeout=0.3, shutdown_timeout=0.1)

    assert [t.name for t in set(threading.enumerate()) - threads_before] == []  # the worker stopped
    assert inspector.get_task(stuck.id).state == "pending"  # given back by the shutdown


def test_a_burst_inside_a_capture_captures_what_handlers_enqueue(prefix):
    fan_out.enqueue(2)
    with capture_tasks() as captured:
        summary = run_worker_burst()
    assert summary.succeeded == 1
    captured.assert_enqueued(total, args=[0, 1], count=1)


# Fake Redis


def test_fake_redis_runs_enqueue_and_a_burst_without_touching_redis(prefix, redis_client):
    with use_fake_redis() as fake:
        message = total.enqueue(4, 5)
        assert fake.hget(f"{prefix}:{{default}}:state", message.id) == "pending"

        summary = run_worker_burst()

        assert summary.results == {message.id: 9}
        found = Inspector(get_broker()).get_task(message.id)
        assert (found.state, found.result) == ("completed", 9)
    assert list(redis_client.scan_iter(f"{prefix}:*")) == []
    assert "fake" not in type(get_broker().client).__module__  # back on the real Redis


def test_fake_redis_survives_a_settings_change_on_the_same_server(prefix, settings):
    with use_fake_redis() as fake:
        first = total.enqueue(1)
        settings.RTQ = {**settings.RTQ, "DEFAULT_QUEUE": "elsewhere"}
        second = total.enqueue(2)
        broker = get_broker()
        assert "fakeredis" in type(broker.client).__module__
        assert second.queue == "elsewhere"
        assert fake.hget(f"{prefix}:{{default}}:state", first.id) == "pending"
        assert fake.hget(f"{prefix}:{{elsewhere}}:state", second.id) == "pending"


def test_fake_redis_servers_are_separate_per_use(prefix):
    with use_fake_redis():
        message = total.enqueue(1)
    with use_fake_redis() as fake:
        assert fake.keys("*") == []
        assert Inspector(get_broker()).locate([message.id]) == {}


def test_fake_redis_without_lua_support_says_what_to_install(monkeypatch):
    real_find_spec = fake_module.importlib.util.find_spec
    monkeypatch.setattr(
        fake_module.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "lupa" else real_find_spec(name, *args),
    )
    with pytest.raises(ImproperlyConfigured, match=r'pip install "fakeredis\[lua\]"'), use_fake_redis():
        pass


def test_a_fake_redis_block_inside_another_returns_to_the_outer_one(prefix, redis_client):
    with use_fake_redis() as outer:
        with use_fake_redis() as inner:
            first = total.enqueue(1)
        second = total.enqueue(2)  # after the inner block: on the outer fake server again
        assert inner.hget(f"{prefix}:{{default}}:state", first.id) == "pending"
        assert outer.hget(f"{prefix}:{{default}}:state", second.id) == "pending"
    assert list(redis_client.scan_iter(f"{prefix}:*")) == []


def test_a_burst_without_redis_gives_up_and_says_so(prefix, settings):
    from django_rtq.exceptions import BrokerUnavailable
    from tests.support.servers import free_port

    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with pytest.raises(BrokerUnavailable, match=r"gave up: Redis was unreachable for 0.5s"):
        run_worker_burst(give_up_after=0.5, timeout=60)

"""Fault tolerance against a Redis server of the test's own: restarts and outages."""

from __future__ import annotations

import pytest
import redis

from django_rtq.broker import Broker, TaskState
from django_rtq.broker.inspect import Inspector
from django_rtq.connection import redis_client
from django_rtq.exceptions import BrokerUnavailable
from django_rtq.worker.healthchecker import Healthchecker
from django_rtq.worker.server import Worker
from tests.support.polling import wait_for
from tests.support.servers import RedisProcess, cleanup_dir, free_port
from tests.testapp import tasks


@pytest.fixture
def persistent_redis():
    """A redis-server writing every change to its append-only file before answering."""
    server = RedisProcess("--appendonly", "yes", "--appendfsync", "always").start()
    yield server
    server.stop()
    cleanup_dir(server.dir)


def restart(server: RedisProcess) -> None:
    server.kill()  # SIGKILL: no chance to save anything beyond the append-only file
    RedisProcess(
        "--appendonly", "yes", "--appendfsync", "always", port=server.port, directory=server.dir
    ).start()


@pytest.fixture
def own_broker(persistent_redis, prefix):
    broker = Broker(redis_client(persistent_redis.url), prefix=prefix)
    yield broker
    broker.client.close()


def test_enqueued_tasks_survive_a_redis_restart(persistent_redis, own_broker, redis_client):
    messages = [tasks.record.prepare("survivor", i) for i in range(50)]
    own_broker.enqueue(messages)
    restart(persistent_redis)
    inspector = Inspector(own_broker)
    assert wait_for(lambda: _retrying(inspector.count, "default", TaskState.PENDING)) == 50
    Worker(broker=own_broker, queues={"default": 1}, burst=True).run()
    assert sorted(int(v) for v in redis_client.lrange(tasks.report_key("survivor"), 0, -1)) == list(range(50))


def test_a_worker_rides_out_a_redis_restart(persistent_redis, own_broker, redis_client):
    worker = Worker(broker=own_broker, queues={"default": 1})
    worker.start()
    try:
        own_broker.enqueue([tasks.record.prepare("before", 1)])
        wait_for(lambda: redis_client.llen(tasks.report_key("before")) == 1)
        restart(persistent_redis)  # returns once the new server answers
        own_broker.enqueue([tasks.record.prepare("after", 2)])
        wait_for(lambda: redis_client.llen(tasks.report_key("after")) >= 1, timeout=15)
    finally:
        worker.stop()
    assert Inspector(own_broker).queue_stats("default").size == 0


def test_the_healthchecker_reports_an_unreachable_redis(prefix):
    seen = []
    dead = Broker(redis.Redis(port=free_port(), socket_connect_timeout=0.2), prefix=prefix)
    checker = Healthchecker(broker=dead, interval=1, callback=lambda ok, error: seen.append((ok, error)))
    assert checker.run_once() is False
    assert seen[0][0] is False and isinstance(seen[0][1], BrokerUnavailable)


def test_the_healthchecker_reports_a_reachable_redis(broker):
    seen = []
    checker = Healthchecker(broker=broker, interval=1, callback=lambda ok, error: seen.append((ok, error)))
    assert checker.run_once() is True
    assert seen == [(True, None)]


def _retrying(call, *args):
    """Call, returning None while Redis is still coming back."""
    try:
        return call(*args)
    except (BrokerUnavailable, redis.ConnectionError, redis.BusyLoadingError):
        return None

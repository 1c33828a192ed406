"""Replies of a Redis that is up but cannot take writes for now, on real servers: one full
(`maxmemory` with `noeviction`: OOM) and a replica taken for the master (READONLY, as when DNS
still points at the old master after a failover). redis-py makes them OutOfMemoryError and
ReadOnlyError, dropping the reply's code; to django-rtq they are Redis away for a while. Lease
renewals alone run on a full Redis (extend_leases declares allow-oom)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from django_rtq.broker import Broker, TaskState
from django_rtq.broker.inspect import Inspector
from django_rtq.connection import get_broker, reset_broker
from django_rtq.exceptions import BrokerUnavailable
from django_rtq.models import OutboxTask
from django_rtq.outbox import relay
from django_rtq.registry import announce_enqueued
from django_rtq.worker.server import Worker
from tests.support.outbox import make_due
from tests.support.polling import wait_for
from tests.support.runs import reports, wait_state
from tests.support.servers import RedisProcess, cleanup_dir
from tests.testapp import tasks

#: The memory limit of the full server, and the size of the key that fills it past that.
MAXMEMORY_BYTES = 8 * 1024 * 1024
FILLER_BYTES = 2 * MAXMEMORY_BYTES
FILLER_KEY = "filler"
#: A short lease, so that a handler outlasts several lease budgets (1.6 s each) in a few seconds.
SHORT_LEASE = 2.0


class SmallRedis:
    """A redis-server with little memory and `noeviction`: filled, it refuses every write."""

    def __init__(self) -> None:
        self.server = RedisProcess(
            "--maxmemory", str(MAXMEMORY_BYTES), "--maxmemory-policy", "noeviction"
        ).start()
        self.client = redis.Redis(port=self.server.port, decode_responses=True)

    @contextmanager
    def filled(self) -> Iterator[None]:
        """Fill it with one big key (a write allowed while under the limit), then free it."""
        self.client.setrange(FILLER_KEY, FILLER_BYTES, "x")
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # the fault is real
            self.client.set("probe", "1")
        try:
            yield
        finally:
            self.client.delete(FILLER_KEY)  # DEL is allowed to a full server
            wait_for(self._takes_writes, message="the server to take writes again")

    def _takes_writes(self) -> bool:
        return self.client.info("memory")["used_memory"] < MAXMEMORY_BYTES

    def stop(self) -> None:
        self.client.close()
        self.server.stop()
        cleanup_dir(self.server.dir)


@pytest.fixture
def small_redis(settings, prefix) -> Iterator[SmallRedis]:
    """The process's Redis is a small one of this test's own."""
    small = SmallRedis()
    settings.RTQ = {**settings.RTQ, "REDIS_URL": small.server.url}
    reset_broker()
    yield small
    reset_broker()
    small.stop()


@pytest.fixture
def no_errors_logged(caplog) -> Iterator[None]:
    """Fail the test if django-rtq logged an error (a pass that failed, a write dropped)."""
    caplog.set_level(logging.DEBUG, "django_rtq")
    yield
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("django_rtq") and r.levelno >= logging.ERROR
    ]
    assert errors == []


# Out of memory


def test_enqueue_into_a_full_redis_raises_broker_unavailable(small_redis):
    with small_redis.filled(), pytest.raises(BrokerUnavailable, match="command not allowed when used memory"):
        tasks.add.enqueue(1, 2)
    message = tasks.add.enqueue(1, 2)
    assert Inspector(get_broker()).get_task(message.id).state == TaskState.PENDING


@pytest.mark.django_db(transaction=True)
def test_with_the_fallback_a_full_redis_keeps_the_task_in_the_outbox_until_it_is_freed(small_redis, settings):
    settings.RTQ = {**settings.RTQ, "OUTBOX_FALLBACK": True}
    broker = get_broker()
    with small_redis.filled():
        message = tasks.add.enqueue(1, 2)
        assert list(OutboxTask.objects.values_list("task_id", flat=True)) == [message.id]
        make_due()
        with pytest.raises(BrokerUnavailable):  # the relay too keeps it while Redis is full
            relay(broker, using="default", announce=announce_enqueued)
        assert OutboxTask.objects.get().last_error == ""
    assert relay(broker, using="default", announce=announce_enqueued) == 1
    assert Inspector(broker).get_task(message.id).state == TaskState.PENDING
    assert not OutboxTask.objects.exists()


def test_a_completion_refused_by_a_full_redis_is_written_once_freed_and_the_handler_ran_once(
    small_redis, redis_client, no_errors_logged, caplog
):
    broker = get_broker()
    inspector = Inspector(broker)
    # Kept once completed: the settle's first write then needs memory, and a full Redis refuses
    # it (a script whose first write frees memory, as a settle that deletes the task, may run).
    message = tasks.block.using(retention=60).enqueue("finishing")
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=1, relay=False)
    worker.start()
    try:
        wait_for(lambda: reports(redis_client, "finishing:started"), message="the handler to start")
        with small_redis.filled():
            caplog.clear()
            # The registry's writes are refused meanwhile (its lease renewals are not: see below).
            wait_for(lambda: "could not record worker" in caplog.text, message="a registry write refused")
            redis_client.set(tasks.report_key("release:finishing"), "1")  # on the suite's Redis
            wait_for(lambda: len(worker.syncer) == 1, message="the completion to wait in the syncer")
            assert inspector.get_task(message.id).state == TaskState.ACTIVE
        done = wait_state(inspector, message.id, TaskState.COMPLETED)
        assert done.result == "released"
        assert len(worker.syncer) == 0
    finally:
        worker.stop()
    assert reports(redis_client, "finishing:started") == ["1"]
    assert reports(redis_client, "finishing") == ["done"]


def test_leases_are_renewed_on_a_full_redis_and_a_long_handler_runs_on(
    small_redis, redis_client, prefix, no_errors_logged, caplog
):
    broker = Broker(get_broker().client, prefix=prefix, lease_seconds=SHORT_LEASE)
    active = broker.queue("default").active
    message = tasks.block.enqueue("outlasting", seconds=60)
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=1, relay=False)
    worker.start()
    try:
        wait_for(lambda: reports(redis_client, "outlasting:started"), message="the handler to start")
        with small_redis.filled():
            caplog.clear()
            wait_for(lambda: "could not record worker" in caplog.text, message="a registry write refused")
            # extend_leases may run on a full Redis (allow-oom): the lease's expiry moves on, past
            # three leases from now, while the worker would stop the handler after 0.8 of one.
            expiry = broker.client.zscore(active, message.id)
            wait_for(
                lambda: broker.client.zscore(active, message.id) > expiry + 3 * SHORT_LEASE * 1000,
                timeout=5 * SHORT_LEASE,
                message="the lease renewed while Redis is full",
            )
            assert worker.processor.owned_by_queue() == {"default": [(message.id, True)]}
            redis_client.set(tasks.report_key("release:outlasting"), "1")  # on the suite's Redis
            # Its settle deletes the task (no retention): a full Redis runs it.
            wait_state(Inspector(broker), message.id, None)
    finally:
        worker.stop()
    assert reports(redis_client, "outlasting:started") == ["1"]  # never stopped, never run again
    assert reports(redis_client, "outlasting") == ["done"]


def test_a_result_waiting_for_memory_keeps_its_lease(small_redis, redis_client, prefix, no_errors_logged):
    # A full Redis refuses the completion, not the recoverers' take-backs: the task must stay
    # the worker's (its lease renewed) while its result waits, or another worker runs it again.
    broker = Broker(get_broker().client, prefix=prefix, lease_seconds=SHORT_LEASE)
    active = broker.queue("default").active
    message = tasks.block.using(retention=60).enqueue("kept")
    worker = Worker(broker=broker, queues={"default": 1}, concurrency=1, relay=False)
    worker.start()
    try:
        wait_for(lambda: reports(redis_client, "kept:started"), message="the handler to start")
        with small_redis.filled():
            redis_client.set(tasks.report_key("release:kept"), "1")  # on the suite's Redis
            wait_for(lambda: len(worker.syncer) == 1, message="the completion to wait in the syncer")
            ended = broker.client.zscore(active, message.id)
            # Renewed past two leases after its handler ended: nobody may take it back.
            wait_for(
                lambda: broker.client.zscore(active, message.id) > ended + 2 * SHORT_LEASE * 1000,
                timeout=5 * SHORT_LEASE,
                message="the lease renewed while the result waits",
            )
            assert broker.recover("default", grace_ms=0, max_recoveries=5) == []
        wait_state(Inspector(broker), message.id, TaskState.COMPLETED)
    finally:
        worker.stop()
    assert reports(redis_client, "kept:started") == ["1"]


def test_a_worker_started_on_a_full_redis_rides_it_out(small_redis, redis_client, no_errors_logged, caplog):
    message = tasks.record.enqueue("waited", 1)
    worker = Worker(broker=get_broker(), queues={"default": 1}, concurrency=1, relay=False)
    try:
        with small_redis.filled():
            worker.start()  # what it writes as it starts is refused
            wait_for(lambda: "could not record worker" in caplog.text, message="its registration refused")
        wait_state(Inspector(get_broker()), message.id, None)
    finally:
        worker.stop()
    assert reports(redis_client, "waited") == ["1"]


# A replica taken for the master


@pytest.fixture
def replica(settings, prefix) -> Iterator[RedisProcess]:
    """The process's Redis is a real replica (of a master of this test's own)."""
    master = RedisProcess().start()
    replica = RedisProcess("--replicaof", "127.0.0.1", str(master.port)).start()
    settings.RTQ = {**settings.RTQ, "REDIS_URL": replica.url}
    reset_broker()
    yield replica
    reset_broker()
    for server in (replica, master):
        server.stop()
        cleanup_dir(server.dir)


def test_enqueue_to_a_replica_raises_broker_unavailable(replica):
    with pytest.raises(BrokerUnavailable, match="You can't write against a read only replica"):
        tasks.add.enqueue(1, 2)

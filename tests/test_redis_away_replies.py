"""Replies of a Redis that cannot take commands for a while, each made by a real server in that
state: LOADING (a restart reading a large dump), MASTERDOWN (a writable replica whose master
died, with `replica-serve-stale-data no`), CLUSTERDOWN (a Cluster master killed) and TRYAGAIN (a Cluster
slot mid-migration). Through the real client, each is Redis away: `enqueue()` keeps the task in
the outbox (OUTBOX_FALLBACK), the relay keeps it while the fault lasts and sends it after, and
the server's own error counts (INFO errorstats) show the fault's reply was given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from django_rtq.broker import TaskState
from django_rtq.broker.inspect import Inspector
from django_rtq.broker.keys import Keyspace
from django_rtq.connection import get_broker, reset_broker
from django_rtq.exceptions import BrokerUnavailable
from django_rtq.models import OutboxTask
from django_rtq.outbox import relay
from django_rtq.registry import announce_enqueued
from tests.support.cluster import Cluster, started_cluster, wait_until_ready
from tests.support.outbox import make_due
from tests.support.polling import wait_for
from tests.support.servers import RedisProcess, cleanup_dir
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: The queue the tests' tasks go to (tasks.add's), and its Cluster slot.
QUEUE = "default"
SLOT = key_slot(QUEUE.encode())
#: Keys in the dump a restarted server loads, and the time it takes over each at first (µs):
#: long enough for the test (80 s), which then lets it finish at once.
LOADED_KEYS = 80_000
KEY_LOAD_DELAY_US = 1000


def reply_count(client: redis.Redis, code: str) -> int:
    """How many replies with this error code the server has given (INFO errorstats)."""
    return int(client.info("errorstats").get(f"errorstat_{code}", {}).get("count", 0))


def kept_while_away_then_sent(
    settings, url: str, fault: Callable[[], AbstractContextManager[redis.Redis]], code: str
) -> None:
    """With the process's Redis at `url`: while `fault` lasts, a task enqueued is kept in the
    outbox and the relay keeps it, the server (the client `fault` gives) answering `code`; once
    the fault is over, the relay sends it, and it is pending."""
    settings.RTQ = {**settings.RTQ, "REDIS_URL": url, "OUTBOX_FALLBACK": True}
    reset_broker()
    broker = get_broker()
    with fault() as faulty:
        before = reply_count(faulty, code)
        message = tasks.add.enqueue(1, 2)
        assert list(OutboxTask.objects.values_list("task_id", flat=True)) == [message.id]
        make_due()
        with pytest.raises(BrokerUnavailable):
            relay(broker, using="default", announce=announce_enqueued)
        assert OutboxTask.objects.get().last_error == ""  # kept as Redis away, not as a failure
        assert reply_count(faulty, code) > before  # the fault landed
    assert relay(broker, using="default", announce=announce_enqueued) == 1
    assert Inspector(broker).get_task(message.id).state == TaskState.PENDING
    assert not OutboxTask.objects.exists()
    reset_broker()


# LOADING


@pytest.fixture
def dumped() -> Iterator[RedisProcess]:
    """A stopped server whose directory holds a dump of LOADED_KEYS keys."""
    server = RedisProcess().start()
    with redis.Redis(port=server.port) as client:
        pipe = client.pipeline(transaction=False)
        for n in range(LOADED_KEYS):
            pipe.set(f"loaded:{n}", n)
        pipe.execute()
        client.save()
    server.stop()
    yield server
    cleanup_dir(server.dir)


def test_a_server_loading_its_dump_is_redis_away(settings, prefix, dumped):
    server = RedisProcess(
        "--key-load-delay", str(KEY_LOAD_DELAY_US),
        "--loading-process-events-interval-bytes", "1024",  # answer clients while loading
        port=dumped.port, directory=dumped.dir,
    )  # fmt: skip

    @contextmanager
    def loading() -> Iterator[redis.Redis]:
        client = redis.Redis(port=server.port, decode_responses=True, retry=Retry(NoBackoff(), 0))
        server.launch()
        wait_for(lambda: answers_loading(client), message="the server to answer LOADING")
        yield client
        assert answers_loading(client)  # still loading: what the test saw was LOADING
        client.config_set("key-load-delay", 0)
        wait_for(lambda: client.dbsize() == LOADED_KEYS, ignoring=(redis.ConnectionError,))
        client.close()

    try:
        kept_while_away_then_sent(settings, server.url, loading, "LOADING")
    finally:
        server.stop()


def answers_loading(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.exceptions.BusyLoadingError:
        return True
    except redis.ConnectionError:  # not listening yet
        return False
    return False


# MASTERDOWN


def test_a_replica_that_lost_its_master_and_serves_no_stale_data_is_redis_away(settings, prefix):
    master = RedisProcess().start()
    replica = RedisProcess("--replicaof", "127.0.0.1", str(master.port)).start()

    @contextmanager
    def master_down() -> Iterator[redis.Redis]:
        client = redis.Redis(port=replica.port, decode_responses=True)
        wait_for(
            lambda: client.info("replication")["master_link_status"] == "up", message="the replica to sync"
        )
        client.config_set("replica-serve-stale-data", "no")
        # Writable, or it would answer READONLY to a write before it looks at its master's link.
        client.config_set("replica-read-only", "no")
        master.kill()
        wait_for(lambda: client.info("replication")["master_link_status"] == "down", message="the link down")
        yield client
        client.replicaof("NO", "ONE")  # the failover: the replica is promoted
        client.close()

    try:
        kept_while_away_then_sent(settings, replica.url, master_down, "MASTERDOWN")
    finally:
        for server in (replica, master):
            server.stop()
            cleanup_dir(server.dir)


# CLUSTERDOWN


def test_a_cluster_that_lost_a_master_is_redis_away(settings, prefix):
    with started_cluster() as (cluster, nodes):
        owner = slot_owner(cluster)
        # Keys off the queue's slot on its master too (the queue registry, the signatures), so
        # that every command meets the cluster down (CLUSTERDOWN), none the dead master.
        with cluster.client() as client:
            owned = {
                slot for slot in range(16384) if client.nodes_manager.get_node_from_slot(slot).port == owner
            }
        settings.RTQ = {**settings.RTQ, "KEY_PREFIX": prefix_within(prefix, owned)}
        [victim, *_] = [node for node in nodes if node.port != owner]
        restarted = RedisProcess(*victim.extra, port=victim.port, directory=victim.dir)

        @contextmanager
        def master_killed() -> Iterator[redis.Redis]:
            client = cluster.node_client(owner)
            victim.kill()
            wait_for(lambda: client.cluster("info")["cluster_state"] == "fail", message="the cluster down")
            yield client
            restarted.start()
            wait_until_ready(list(cluster.ports))
            client.close()

        try:
            url = f"redis+cluster://127.0.0.1:{owner}/0"
            kept_while_away_then_sent(settings, url, master_killed, "CLUSTERDOWN")
        finally:
            restarted.stop()


# TRYAGAIN


def test_a_multi_key_script_on_a_slot_mid_migration_is_redis_away_until_it_moved(settings, prefix):
    with started_cluster() as (cluster, _):
        source = slot_owner(cluster)
        [target, *_] = [port for port in cluster.ports if port != source]
        settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+cluster://127.0.0.1:{source}/0"}
        reset_broker()
        first = tasks.add.enqueue(1, 1)  # some of the queue's keys exist on the source now

        @contextmanager
        def migrating() -> Iterator[redis.Redis]:
            client, other = cluster.node_client(source), cluster.node_client(target)
            source_id, target_id = client.cluster("myid"), other.cluster("myid")
            other.execute_command("CLUSTER SETSLOT", SLOT, "IMPORTING", source_id)
            client.execute_command("CLUSTER SETSLOT", SLOT, "MIGRATING", target_id)
            yield client
            keys = client.execute_command("CLUSTER GETKEYSINSLOT", SLOT, 1000)
            client.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            for port in (target, source, *(p for p in cluster.ports if p not in (source, target))):
                cluster.node_client(port).execute_command("CLUSTER SETSLOT", SLOT, "NODE", target_id)
            client.close()
            other.close()

        kept_while_away_then_sent(settings, f"redis+cluster://127.0.0.1:{source}/0", migrating, "TRYAGAIN")
        # The first task moved with its keys, and the client followed it (MOVED).
        assert Inspector(get_broker()).get_task(first.id).state == TaskState.PENDING
        reset_broker()


def prefix_within(base: str, slots: set[int]) -> str:
    """A key prefix from `base` whose keys off the queues' slots are all in `slots`."""
    for n in range(10_000):
        keys = Keyspace(f"{base}-{n}")
        if {key_slot(key.encode()) for key in (keys.queues, keys.signatures, keys.workers)} <= slots:
            return keys.prefix
    raise AssertionError(f"no prefix from {base!r} has its keys in those slots")


def slot_owner(cluster: Cluster) -> int:
    """The port of the master that holds the queue's slot."""
    with cluster.client() as client:
        return client.nodes_manager.get_node_from_slot(SLOT).port

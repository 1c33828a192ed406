"""Every way to tell django-rtq where Redis is, each against real servers."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
import redis.cluster
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from django_rtq.broker import Broker, TaskMessage, TaskState
from django_rtq.broker.inspect import Inspector
from django_rtq.connection import get_broker, redis_client, redis_target, reset_broker
from django_rtq.exceptions import BrokerUnavailable
from django_rtq.redis_url import close_client, parse_url, redact
from django_rtq.worker.server import Worker
from tests.support.cluster import Cluster
from tests.support.polling import wait_for
from tests.support.servers import RedisProcess, SentinelProcess, cleanup_dir, free_port
from tests.testapp import tasks

SERVICE = "rtqmaster"
PASSWORD = "s3cr/et@pw"  # characters that need quoting in a URL
QUOTED_PASSWORD = "s3cr%2Fet%40pw"
CLUSTER_QUEUES = ("emails", "search", "billing")  # keys on the three nodes of the test cluster


# Parsing, no I/O


@pytest.mark.parametrize(
    ("url", "mode", "nodes", "service", "options"),
    [
        ("redis://127.0.0.1:6379/0", "standalone", (), "", {}),
        ("rediss://:pw@example.com:6380/2", "standalone", (), "", {}),
        ("unix:///run/redis.sock?db=3", "standalone", (), "", {}),
        (
            f"redis+sentinel://:{QUOTED_PASSWORD}@s1:26380,s2,[::1]:26381/mymaster/2?socket_timeout=0.5",
            "sentinel",
            (("s1", 26380), ("s2", 26379), ("::1", 26381)),
            "mymaster",
            {"password": PASSWORD, "socket_timeout": 0.5, "db": 2},
        ),
        ("rediss+sentinel://s1/mymaster", "sentinel", (("s1", 26379),), "mymaster", {"ssl": True}),
        (
            "redis+cluster://user:pw@n1:7000,n2:7001/0?socket_connect_timeout=2",
            "cluster",
            (("n1", 7000), ("n2", 7001)),
            "",
            {"username": "user", "password": "pw", "socket_connect_timeout": 2.0},
        ),
        ("rediss+cluster://n1", "cluster", (("n1", 6379),), "", {"ssl": True}),
    ],
)
def test_urls_parse_into_targets(url, mode, nodes, service, options):
    target = parse_url(url)
    assert (target.mode, target.nodes, target.service, target.options) == (mode, nodes, service, options)


def test_sentinel_url_options_for_the_sentinels_themselves():
    target = parse_url("redis+sentinel://s1/mymaster?sentinel_password=x&sentinel_username=u")
    assert target.sentinel_options == {"password": "x", "username": "u"}
    assert target.options == {}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty string"),
        ("http://example.com", "unknown scheme"),
        ("redis://host:port/0", "Port could not be cast"),
        ("redis://host/zero", "database number"),
        ("redis+sentinel://s1:26379", "service name"),
        ("redis+sentinel://s1/mymaster/zero", "database must be a number"),
        ("redis+sentinel://s1:x/mymaster", "port 'x'"),
        ("redis+sentinel:///mymaster", "names no host"),
        ("redis+cluster://n1:7000/1", "only has database 0"),
        ("redis+cluster://n1?socket_timeout=soon", "socket_timeout"),
        ("redis+cluster://n1,,n2", "is not host"),
    ],
)
def test_invalid_urls_are_refused_naming_the_problem(url, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_url(url)


def test_passwords_are_kept_out_of_messages():
    assert redact("redis://user:hunter2@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact("redis+sentinel://:hunter2@s1,s2/mymaster") == "redis+sentinel://:***@s1,s2/mymaster"
    with pytest.raises(ImproperlyConfigured) as caught:
        parse_url("redis+cluster://:hunter2@n1/5")
    assert "hunter2" not in str(caught.value)


def test_decode_responses_cannot_be_turned_off(settings):
    settings.RTQ = {**settings.RTQ, "REDIS_OPTIONS": {"decode_responses": False}}
    with pytest.raises(ImproperlyConfigured, match="decode_responses"):
        redis_target()


# Real servers


@dataclass
class SentinelSetup:
    master: RedisProcess
    sentinels: list[SentinelProcess]

    def url(self, db: int = 0, scheme: str = "redis+sentinel") -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"{scheme}://{hosts}/{SERVICE}/{db}"

    def master_client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(port=self.master.port, db=db, decode_responses=True)


@pytest.fixture(scope="module")
def sentinel_setup() -> Iterator[SentinelSetup]:
    """A throwaway master and two sentinels watching it."""
    servers: list[RedisProcess] = []
    try:
        master = RedisProcess()
        servers.append(master)
        master.start()
        sentinels = []
        for _ in range(2):
            sentinels.append(SentinelProcess(master.port, SERVICE))
            servers.append(sentinels[-1])
            sentinels[-1].start()
        yield SentinelSetup(master=master, sentinels=sentinels)
    finally:
        for server in servers:
            server.stop()
            cleanup_dir(server.dir)


@pytest.fixture(scope="module")
def password_server() -> Iterator[RedisProcess]:
    """A throwaway Redis that wants a password."""
    server = RedisProcess(password=PASSWORD)
    try:
        yield server.start()
    finally:
        server.stop()
        cleanup_dir(server.dir)


@pytest.fixture
def cluster_prefix(prefix: str, redis_cluster: Cluster) -> Iterator[str]:
    """The test's key prefix, whose keys on the test cluster are deleted afterwards."""
    yield prefix
    reset_broker()
    client = redis_cluster.client()
    try:
        for node in client.get_primaries():
            node_client = client.get_redis_connection(node)
            for key in node_client.scan_iter(f"{prefix}:*", count=1000):
                node_client.delete(key)
    finally:
        client.close()


def use(settings, **rtq) -> Broker:
    """Point settings.RTQ somewhere (keeping the test's prefix) and return the broker it builds."""
    settings.RTQ = {**settings.RTQ, **rtq}
    return get_broker()


def enqueue_and_claim(broker: Broker, queue: str = "default") -> None:
    message = TaskMessage(id=uuid.uuid4().hex, task="tests.noop", queue=queue, enqueued_at=time.time())
    broker.enqueue([message])
    claimed = broker.claim(queue, worker_id="test-worker", limit=10)
    assert [task.id for task in claimed] == [message.id]
    assert claimed[0].raw_message
    assert TaskMessage.from_json(claimed[0].raw_message, id=message.id, queue=queue) == message


def test_plain_url(settings, prefix, redis_url, redis_client):
    broker = use(settings, REDIS_URL=redis_url)
    assert isinstance(broker.client, redis.Redis)
    enqueue_and_claim(broker)
    assert redis_client.zcard(broker.queue("default").active) == 1


def test_redis_options_reach_the_client(settings, prefix, redis_url):
    broker = use(
        settings, REDIS_URL=redis_url, REDIS_OPTIONS={"client_name": "rtq-options", "socket_timeout": 7}
    )
    assert broker.client.client_getname() == "rtq-options"
    assert broker.client.connection_pool.connection_kwargs["socket_timeout"] == 7


def test_unix_socket_url(settings, prefix, tmp_path):
    socket = tmp_path / "redis.sock"
    server = RedisProcess("--unixsocket", str(socket), "--unixsocketperm", "700").start()
    try:
        broker = use(settings, REDIS_URL=f"unix://{socket}?db=2")
        enqueue_and_claim(broker)
        with redis.Redis(unix_socket_path=str(socket), db=2) as direct:
            assert direct.exists(broker.queue("default").msg)
    finally:
        reset_broker()
        server.stop()
        cleanup_dir(server.dir)


def test_password_in_the_url(settings, prefix, password_server):
    broker = use(settings, REDIS_URL=f"redis://:{QUOTED_PASSWORD}@127.0.0.1:{password_server.port}/1")
    enqueue_and_claim(broker)


def test_django_redis_cache_alias(settings, prefix, password_server):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{password_server.port}/3",
            "OPTIONS": {
                "PASSWORD": PASSWORD,
                "SOCKET_TIMEOUT": 5,
                "SOCKET_CONNECT_TIMEOUT": 2,
                "CONNECTION_POOL_KWARGS": {"client_name": "rtq-from-cache"},
                "SERIALIZER": "django_redis.serializers.pickle.PickleSerializer",
            },
        },
    }
    broker = use(settings, CACHE_ALIAS="redis")
    enqueue_and_claim(broker)
    kwargs = broker.client.connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (3, 5, 2)
    assert broker.client.client_getname() == "rtq-from-cache"
    # The cache keeps its own pool, bytes and pickles; ours decodes.
    cache = caches["redis"]
    cache.set("rtq-test-key", {"a": 1})
    assert cache.get("rtq-test-key") == {"a": 1}
    assert cache.client.get_client().connection_pool is not broker.client.connection_pool
    assert broker.client.smembers(broker.keys.queues) == {"default"}  # str, not bytes
    cache.delete("rtq-test-key")


@pytest.mark.parametrize(
    ("backend", "location"),
    [
        ("django_redis.cache.RedisCache", ["redis://first:6379/1", "redis://second:6379/1"]),
        ("django_redis.cache.RedisCache", "redis://first:6379/1,redis://second:6379/1"),
        ("django.core.cache.backends.redis.RedisCache", "redis://first:6379/1;redis://second:6379/1"),
    ],
)
def test_the_first_cache_location_is_the_one_used(settings, backend, location):
    settings.CACHES = {"default": {"BACKEND": backend, "LOCATION": location}}
    settings.RTQ = {**settings.RTQ, "CACHE_ALIAS": "default"}
    assert redis_target().url == "redis://first:6379/1"


def test_django_builtin_redis_cache_alias(settings, prefix, redis_url):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "builtin": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"{redis_url};redis://127.0.0.1:1/0",
            "OPTIONS": {"db": 0, "pool_class": "redis.BlockingConnectionPool", "client_name": "rtq-builtin"},
        },
    }
    broker = use(settings, CACHE_ALIAS="builtin")
    assert isinstance(broker.client.connection_pool, redis.BlockingConnectionPool)
    assert broker.client.client_getname() == "rtq-builtin"
    enqueue_and_claim(broker)


@pytest.mark.parametrize(
    ("caches_setting", "message"),
    [
        ({}, "no such cache"),
        ({"other": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}, "no such cache"),
        ({"x": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}, "not a Redis cache"),
        ({"x": {"BACKEND": "no.such.Backend"}}, "cannot be imported"),
        ({"x": {"BACKEND": "django_redis.cache.RedisCache"}}, "no LOCATION"),
        ({"x": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "http://h"}}, "unknown scheme"),
        (
            {
                "x": {
                    "BACKEND": "django_redis.cache.RedisCache",
                    "LOCATION": "redis://mymaster/0",
                    "OPTIONS": {"CLIENT_CLASS": "django_redis.client.SentinelClient"},
                }
            },
            "SENTINELS",
        ),
    ],
)
def test_unusable_cache_aliases_are_refused(settings, caches_setting, message):
    settings.CACHES = caches_setting or {
        "default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}
    }
    settings.RTQ = {**settings.RTQ, "CACHE_ALIAS": "x"}
    with pytest.raises(ImproperlyConfigured, match=message):
        redis_target()


def test_sentinel_url(settings, prefix, sentinel_setup):
    broker = use(settings, REDIS_URL=sentinel_setup.url(db=4))
    assert broker.hands_off
    enqueue_and_claim(broker)
    with sentinel_setup.master_client(db=4) as master:
        assert master.zcard(broker.queue("default").active) == 1


def test_closing_a_sentinel_client_closes_the_sentinel_connections(sentinel_setup):
    client = redis_client(sentinel_setup.url())
    assert client.ping()
    sentinel = client.connection_pool.sentinel_manager

    def open_sockets() -> int:
        pools = [client.connection_pool, *(s.connection_pool for s in sentinel.sentinels)]
        return sum(c._sock is not None for pool in pools for c in pool._available_connections)

    assert open_sockets() >= 2  # the master's, and the sentinel's that named it
    close_client(client)
    assert open_sockets() == 0


def test_django_redis_sentinel_cache_alias(settings, prefix, sentinel_setup):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SERVICE}/5",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", sentinel.port) for sentinel in sentinel_setup.sentinels],
                "SOCKET_TIMEOUT": 5,
            },
        },
    }
    target = redis_target_for(settings, "sentinel")
    assert (target.mode, target.service, target.options["db"]) == ("sentinel", SERVICE, 5)
    broker = get_broker()
    enqueue_and_claim(broker)
    with sentinel_setup.master_client(db=5) as master:
        assert master.zcard(broker.queue("default").active) == 1
    caches["sentinel"].set("rtq-test-key", 1)  # django-redis still works beside us
    assert caches["sentinel"].get("rtq-test-key") == 1


def redis_target_for(settings, alias: str):
    settings.RTQ = {**settings.RTQ, "CACHE_ALIAS": alias}
    return redis_target()


def test_cluster_url(settings, cluster_prefix, redis_cluster):
    hosts = ",".join(f"127.0.0.1:{port}" for port in redis_cluster.ports[:2])
    broker = use(settings, REDIS_URL=f"redis+cluster://{hosts}")
    assert isinstance(broker.client, redis.cluster.RedisCluster)
    assert not broker.hands_off
    for queue in CLUSTER_QUEUES:
        enqueue_and_claim(broker, queue)


def test_an_unreachable_cluster_is_broker_unavailable(settings, prefix):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+cluster://127.0.0.1:{free_port()}"}
    with pytest.raises(BrokerUnavailable, match="Redis Cluster via"):
        get_broker()


def test_cluster_redis_options_reach_every_node(redis_cluster):
    client = redis_client(f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}", client_name="rtq-cluster")
    try:
        names = client.client_getname(target_nodes=redis.cluster.RedisCluster.ALL_NODES)
        assert set(names.values()) == {"rtq-cluster"}
    finally:
        close_client(client)


# A worker, through a broker made from each form


@pytest.fixture(params=["url", "cache", "sentinel", "cluster"])
def configured_broker(request, settings, prefix) -> Broker:
    if request.param == "url":
        return use(settings, REDIS_URL=request.getfixturevalue("redis_url"))
    if request.param == "cache":
        settings.CACHES = {
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": request.getfixturevalue("redis_url"),
            }
        }
        return use(settings, CACHE_ALIAS="default")
    if request.param == "sentinel":
        return use(settings, REDIS_URL=request.getfixturevalue("sentinel_setup").url())
    cluster = request.getfixturevalue("redis_cluster")
    request.getfixturevalue("cluster_prefix")
    return use(settings, REDIS_URL=f"redis+cluster://127.0.0.1:{cluster.ports[0]}")


def test_a_worker_runs_a_task_through_each_form(configured_broker):
    inspector = Inspector(configured_broker)
    worker = Worker(broker=configured_broker, queues={"default": 1}, concurrency=2)
    worker.start()
    try:
        message = tasks.add.enqueue(2, 3)
        done = wait_for(
            lambda: (info := inspector.get_task(message.id)).state == TaskState.COMPLETED and info,
            message="the task to complete",
        )
    finally:
        worker.stop()
    assert done.result == 5

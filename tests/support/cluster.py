"""Fixtures for tests that run on Redis Cluster as well as on the standalone Redis.

`redis_cluster` starts a 3-master Redis Cluster on loopback ports for the session;
`cluster_broker` is a broker over it, on a key prefix of the test's own; `any_broker` runs a
test twice, on the standalone Redis and on the cluster, with a clock the test moves by hand.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from django_rtq.broker import Broker
from tests.support.clock import FakeClock
from tests.support.polling import wait_for
from tests.support.servers import RedisProcess, cleanup_dir, free_port, server_binary

HOST = "127.0.0.1"
SLOTS = 16384
NODES = 3
#: A port's cluster bus listens on the port plus this.
BUS_OFFSET = 10000
READY_TIMEOUT = 20.0


@dataclass(frozen=True)
class Cluster:
    """A running cluster: its nodes' ports, and a way in."""

    ports: tuple[int, ...]

    @property
    def startup_node(self) -> ClusterNode:
        return ClusterNode(HOST, self.ports[0])

    def client(self) -> RedisCluster:
        return RedisCluster(host=HOST, port=self.ports[0], decode_responses=True)

    def node_client(self, port: int) -> redis.Redis:
        return redis.Redis(host=HOST, port=port, decode_responses=True)


def cluster_port() -> int:
    """Return a free loopback port whose cluster bus port is free too."""
    return free_port(also=BUS_OFFSET)


def cli_binary() -> str | None:
    """Return the redis-cli (or valkey-cli) beside the server binary, or on PATH."""
    beside = Path(server_binary()).parent
    for name in ("redis-cli", "valkey-cli"):
        if (beside / name).exists():
            return str(beside / name)
    return shutil.which("redis-cli") or shutil.which("valkey-cli")


def cluster_node() -> RedisProcess:
    directory = tempfile.mkdtemp(prefix="rtq-cluster-")
    return RedisProcess(
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        str(Path(directory) / "nodes.conf"),
        "--cluster-node-timeout",
        "2000",
        port=cluster_port(),
        directory=directory,
    )


def create_with_cli(cli: str, ports: list[int]) -> None:
    addresses = [f"{HOST}:{port}" for port in ports]
    subprocess.run(
        [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=READY_TIMEOUT,
    )


def create_with_commands(ports: list[int]) -> None:
    """Do what `redis-cli --cluster create` does: share out the slots, then introduce the nodes."""
    bounds = [SLOTS * i // len(ports) for i in range(len(ports) + 1)]
    for epoch, port in enumerate(ports, start=1):
        with redis.Redis(host=HOST, port=port) as client:
            client.execute_command("CLUSTER ADDSLOTSRANGE", bounds[epoch - 1], bounds[epoch] - 1)
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
    with redis.Redis(host=HOST, port=ports[0]) as client:
        for port in ports[1:]:
            client.execute_command("CLUSTER MEET", HOST, port)


def node_ready(port: int, nodes: int) -> bool:
    """Whether the node reports the cluster ok and knows every other node."""
    with redis.Redis(host=HOST, port=port, decode_responses=True) as client:
        info = client.cluster("info")
    return info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == nodes


def wait_until_ready(ports: list[int]) -> None:
    """Poll every node until it reports the cluster ok and knows every other node."""
    for port in ports:
        wait_for(
            lambda port=port: node_ready(port, len(ports)),
            READY_TIMEOUT,
            interval=0.05,
            message=f"cluster node {port} to be ready",
        )


@contextmanager
def started_cluster(count: int = NODES) -> Iterator[tuple[Cluster, list[RedisProcess]]]:
    """A cluster of `count` masters of its own, and its nodes' processes (to kill one)."""
    nodes: list[RedisProcess] = []
    try:
        for _ in range(count):
            nodes.append(cluster_node())
            nodes[-1].start()
        ports = [node.port for node in nodes]
        cli = cli_binary()
        if cli:
            create_with_cli(cli, ports)
        else:
            create_with_commands(ports)
        wait_until_ready(ports)
        yield Cluster(ports=tuple(ports)), nodes
    finally:
        for node in nodes:
            node.stop()
            cleanup_dir(node.dir)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Cluster]:
    with started_cluster() as (cluster, _):
        yield cluster


@pytest.fixture
def cluster_broker(redis_cluster: Cluster) -> Iterator[Broker]:
    """A broker over the cluster, on a key prefix of this test's own."""
    prefix = f"rtqc-{uuid.uuid4().hex[:10]}"
    client = redis_cluster.client()
    yield Broker(client, prefix=prefix)
    for node in client.get_primaries():
        node_client = client.get_redis_connection(node)
        for key in node_client.scan_iter(f"{prefix}:*", count=1000):
            node_client.delete(key)
    client.close()


@pytest.fixture(params=["standalone", "cluster"])
def any_broker(request: pytest.FixtureRequest, clock: FakeClock) -> Broker:
    """A broker on the standalone Redis, then on the cluster, reading time from `clock`."""
    broker = request.getfixturevalue("broker" if request.param == "standalone" else "cluster_broker")
    broker.clock = clock
    return broker

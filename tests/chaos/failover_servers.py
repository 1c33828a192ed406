"""Throwaway replicated Redis set-ups whose master can be failed over, for tests/chaos/test_failover.py.

- `SentinelGroup`: a master, one replica and three sentinels (quorum 2) on loopback ports.
- `ReplicatedCluster`: a Redis Cluster of three masters, each with one replica.

Every server is a foreground child process (tests/support/servers.py) stopped by `close()`; the
kernel stops them too if the test run dies first.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from tests.support.cluster import HOST, cli_binary, cluster_port
from tests.support.polling import wait_for
from tests.support.servers import RedisProcess, SentinelProcess, cleanup_dir

SERVICE = "mymaster"
#: Seconds a set-up gets to become ready, or to finish a failover.
READY_TIMEOUT = 30.0
#: The errors of a server that is not ready yet: the waits below take them for "not yet".
NOT_YET = (redis.RedisError, OSError)


def _client(port: int) -> redis.Redis:
    return redis.Redis(
        host=HOST, port=port, decode_responses=True, socket_timeout=2, socket_connect_timeout=1
    )


def _replication(port: int) -> dict[str, Any]:
    with _client(port) as client:
        return client.info("replication")


def _replica_online(master_port: int, replica_port: int) -> bool:
    """Whether the master has `replica_port` as an online replica that has caught up with it."""
    info = _replication(master_port)
    for key, value in info.items():
        if key.startswith("slave") and isinstance(value, dict) and int(value.get("port", 0)) == replica_port:
            return value.get("state") == "online" and int(value["offset"]) >= int(info["master_repl_offset"])
    return False


class SentinelGroup:
    """A master, a replica of it and three sentinels watching them (quorum 2)."""

    def __init__(self) -> None:
        self.servers: list[RedisProcess] = []
        self.master = self._add(RedisProcess())
        self.replica = self._add(RedisProcess("--replicaof", HOST, str(self.master.port)))
        self.sentinels = [
            self._add(
                SentinelProcess(
                    self.master.port, SERVICE, quorum=2, down_after_ms=1000, failover_timeout_ms=5000
                )
            )
            for _ in range(3)
        ]

    def _add(self, server: RedisProcess) -> Any:
        self.servers.append(server)
        return server

    def start(self) -> SentinelGroup:
        try:
            self.master.start()
            self.replica.start()
            wait_for(
                lambda: _replica_online(self.master.port, self.replica.port),
                READY_TIMEOUT,
                message="the replica",
                interval=0.05,
                ignoring=NOT_YET,
            )
            for sentinel in self.sentinels:
                sentinel.start()
            wait_for(
                self._sentinels_ready,
                READY_TIMEOUT,
                message="three sentinels that know each other and the replica",
                interval=0.05,
                ignoring=NOT_YET,
            )
        except BaseException:
            self.close()
            raise
        return self

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels:
            with _client(sentinel.port) as client:
                master = client.sentinel_master(SERVICE)
                replicas = client.sentinel_slaves(SERVICE)
            if master.get("num-other-sentinels") != 2 or master.get("is_sdown") or master.get("is_odown"):
                return False
            if not any(r["port"] == self.replica.port and not r.get("is_sdown") for r in replicas):
                return False
        return True

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"{HOST}:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/{db}"

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers says."""
        for sentinel in self.sentinels:
            try:
                with _client(sentinel.port) as client:
                    return int(client.sentinel_get_master_addr_by_name(SERVICE)[1])
            except redis.RedisError:
                continue
        raise RuntimeError("no sentinel answers")

    def wait_replicated(self, timeout: float = 10.0) -> None:
        """Return once the replica has every write the master acknowledged so far."""
        with _client(self.master.port) as client:
            if client.wait(1, int(timeout * 1000)) < 1:
                raise TimeoutError("the replica did not catch up with the master")

    def failover(self) -> None:
        """Ask a sentinel for a failover now (`SENTINEL FAILOVER`): the replica is promoted at
        once and the old master is turned into its replica."""
        with _client(self.sentinels[0].port) as client:
            client.execute_command("SENTINEL", "FAILOVER", SERVICE)

    def kill_master(self) -> None:
        """SIGKILL the master; the sentinels see it down after a second and promote the replica."""
        self.master.kill()

    def wait_promoted(self, timeout: float = READY_TIMEOUT) -> float:
        """Wait until every live sentinel names the replica as the master and it acts as one;
        return the seconds that took."""
        started = time.monotonic()

        def promoted() -> bool:
            if _replication(self.replica.port)["role"] != "master":
                return False
            for sentinel in self.sentinels:
                with _client(sentinel.port) as client:
                    if int(client.sentinel_get_master_addr_by_name(SERVICE)[1]) != self.replica.port:
                        return False
            return True

        wait_for(
            promoted,
            timeout,
            message=f"the sentinels to promote the replica on port {self.replica.port}",
            interval=0.05,
            ignoring=NOT_YET,
        )
        return time.monotonic() - started

    def close(self) -> None:
        for server in reversed(self.servers):
            server.kill()
            cleanup_dir(server.dir)


class ReplicatedCluster:
    """A Redis Cluster of three masters with one replica each (`--cluster-replicas 1`), with a
    node timeout of 1 s so that a dead master's replica takes over within a few seconds."""

    NODE_TIMEOUT_MS = 1000

    def __init__(self, masters: int = 3) -> None:
        self.nodes: dict[int, RedisProcess] = {}
        for _ in range(2 * masters):
            directory = tempfile.mkdtemp(prefix="rtq-chaos-cluster-")
            node = RedisProcess(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(Path(directory) / "nodes.conf"),
                "--cluster-node-timeout",
                str(self.NODE_TIMEOUT_MS),
                port=cluster_port(),
                directory=directory,
            )
            self.nodes[node.port] = node

    @property
    def ports(self) -> list[int]:
        return list(self.nodes)

    def start(self) -> ReplicatedCluster:
        try:
            for node in self.nodes.values():
                node.start()
            cli = cli_binary()
            if cli is None:
                raise RuntimeError("redis-cli (or valkey-cli) is needed to create a cluster with replicas")
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *(f"{HOST}:{port}" for port in self.ports),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=READY_TIMEOUT,
            )
            wait_for(
                self._ready,
                READY_TIMEOUT,
                message="the cluster: 6 nodes, state ok, replicas in sync",
                interval=0.05,
                ignoring=NOT_YET,
            )
        except BaseException:
            self.close()
            raise
        return self

    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in self.ports)

    def live_ports(self) -> list[int]:
        return [port for port, node in self.nodes.items() if node.process and node.process.poll() is None]

    def topology(self, via: int | None = None) -> dict[int, dict[str, Any]]:
        """Port -> {"id", "role" ("master"/"slave"), "master_port" (a replica's), "failed"}, as a
        live node sees it."""
        port = via or self.live_ports()[0]
        with _client(port) as client:
            raw = client.execute_command("CLUSTER", "NODES")
        if isinstance(raw, dict):  # redis-py parses the reply into a dict keyed by address
            lines = [
                " ".join(
                    [
                        info["node_id"],
                        address,
                        info["flags"],
                        info.get("master_id") or "-",
                    ]
                )
                for address, info in raw.items()
            ]
        else:
            lines = raw.splitlines()
        by_id: dict[str, dict[str, Any]] = {}
        for line in lines:
            fields = line.split()
            node_id, address, flags, master_id = fields[0], fields[1], fields[2], fields[3]
            node_port = int(address.split("@")[0].rsplit(":", 1)[1])
            by_id[node_id] = {
                "id": node_id,
                "port": node_port,
                "role": "master" if "master" in flags else "slave",
                "master_id": master_id,
                "failed": "fail" in flags.split(","),
            }
        result = {}
        for node in by_id.values():
            master = by_id.get(node["master_id"])
            result[node["port"]] = {**node, "master_port": master["port"] if master else None}
        return result

    def _ready(self) -> bool:
        for port in self.ports:
            with _client(port) as client:
                info = client.cluster("info")
            if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != len(self.ports):
                return False
        topology = self.topology()
        replicas = [p for p, node in topology.items() if node["role"] == "slave"]
        if len(replicas) != len(self.ports) // 2:
            return False
        return all(_replica_online(topology[p]["master_port"], p) for p in replicas)

    def master_of(self, key: str) -> int:
        """The port of the master serving `key`'s slot."""
        with _client(self.live_ports()[0]) as client:
            slot = client.execute_command("CLUSTER", "KEYSLOT", key)
            for start, end, master, *_replicas in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(master[1])
        raise RuntimeError(f"no master serves {key!r}")

    def replica_of(self, master_port: int) -> int:
        for port, node in self.topology().items():
            if node["role"] == "slave" and node["master_port"] == master_port:
                return port
        raise RuntimeError(f"master {master_port} has no replica")

    def wait_replicated(self, master_port: int, timeout: float = 10.0) -> None:
        with _client(master_port) as client:
            if client.wait(1, int(timeout * 1000)) < 1:
                raise TimeoutError(f"the replica of {master_port} did not catch up with it")

    def failover(self, replica_port: int) -> None:
        """`CLUSTER FAILOVER` on the replica: a coordinated switch that loses no write."""
        with _client(replica_port) as client:
            client.execute_command("CLUSTER", "FAILOVER")

    def kill(self, port: int) -> None:
        self.nodes[port].kill()

    def wait_promoted(self, replica_port: int, timeout: float = READY_TIMEOUT) -> float:
        """Wait until `replica_port` is a master and every live node says the cluster is ok;
        return the seconds that took."""
        started = time.monotonic()

        def promoted() -> bool:
            if _replication(replica_port)["role"] != "master":
                return False
            for port in self.live_ports():
                with _client(port) as client:
                    if client.cluster("info")["cluster_state"] != "ok":
                        return False
                if self.topology(via=port)[replica_port]["role"] != "master":
                    return False
            return True

        wait_for(
            promoted,
            timeout,
            message=f"the cluster to promote the replica on port {replica_port}",
            interval=0.05,
            ignoring=NOT_YET,
        )
        return time.monotonic() - started

    def close(self) -> None:
        for node in self.nodes.values():
            node.kill()
            cleanup_dir(node.dir)

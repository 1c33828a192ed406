"""What Redis's own configuration means for the tasks it holds: read on every master (CONFIG GET,
or INFO where CONFIG is refused), judged by one rule, and the restart marker of each master.

Used by `manage.py check --deploy` (django_rtq/checks.py) and by the worker (it refuses to start
on an evicting Redis, and its Redis watch, django_rtq/worker/redis_watch.py, tells of a restart
that lost the data). Knows nothing of Django: the setting that accepts eviction is only named.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from .errors import translate_errors
from .keys import Keyspace

#: The only eviction policy under which Redis never deletes a task's keys to make room.
NOEVICTION = "noeviction"
#: The setting by which a project accepts an evicting Redis (django_rtq/conf.py).
ALLOW_SETTING = "RTQ['ALLOW_EVICTING_REDIS']"
#: What a finding is about (the check ids of django_rtq/checks.py are keyed by these).
EVICTS, NOT_PERSISTENT, UNREADABLE, TOO_OLD = "evicts", "not-persistent", "unreadable", "too-old"
#: The oldest Redis the scripts run on: the lease renewal declares a Redis 7 flag (`allow-oom`).
OLDEST_VERSION = (7, 0)
#: Tries at a hash tag that lands on a given Cluster master (of 16,384 slots, a third each).
MAX_TAG_TRIES = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """What one master says of its eviction and persistence; None where it could not be read."""

    node: str  # "host:port", or how else the master is known
    eviction_policy: str | None = None  # maxmemory-policy
    aof: bool | None = None  # appendonly
    save_points: str | None = None  # the RDB `save` setting; "" when RDB snapshots are off
    refused: str = ""  # CONFIG GET's error when it was refused (then INFO was read)
    version: str | None = None  # INFO server's redis_version (Valkey reports the Redis it matches)

    @property
    def persists(self) -> bool | None:
        """Whether the master keeps its data over a restart; None when it cannot be told."""
        if self.aof or self.save_points:
            return True
        if self.aof is False and self.save_points == "":
            return False
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One thing wrong with a master's configuration, for a check message or a log line."""

    kind: str  # EVICTS, NOT_PERSISTENT or UNREADABLE
    node: str
    message: str
    hint: str

    @property
    def is_error(self) -> bool:
        return self.kind in (EVICTS, TOO_OLD)


def version_tuple(version: str) -> tuple[int, ...]:
    """ "7.2.4" -> (7, 2, 4); parts that are not numbers end it."""
    numbers = []
    for part in version.split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def findings(configs: list[ServerConfig], *, eviction_allowed: bool = False) -> list[Finding]:
    """Judge the masters' configurations: an eviction policy other than noeviction is an error
    (unless the project accepts it); no persistence, or a configuration that cannot be read,
    is worth a warning."""
    found = []
    for config in configs:
        policy, node = config.eviction_policy, config.node
        if config.version is not None and version_tuple(config.version) < OLDEST_VERSION:
            oldest = ".".join(map(str, OLDEST_VERSION))
            found.append(
                Finding(
                    kind=TOO_OLD,
                    node=node,
                    message=(
                        f"Redis at {node} is version {config.version}; django-rtq needs {oldest} or "
                        "newer (its lease renewal is a script that declares Redis 7's allow-oom flag, "
                        "which older servers refuse: no lease could be renewed)."
                    ),
                    hint=f"Upgrade Redis to {oldest} or newer (or use Valkey). See docs/redis.md.",
                )
            )
        if policy is not None and policy != NOEVICTION and not eviction_allowed:
            found.append(
                Finding(
                    kind=EVICTS,
                    node=node,
                    message=(
                        f"Redis at {node} evicts keys when it is full (maxmemory-policy {policy}): it "
                        "then deletes tasks' keys (payloads, states, leases, workflow records), so "
                        "tasks that were acknowledged as enqueued are lost without a word."
                    ),
                    hint=(
                        f"Set maxmemory-policy {NOEVICTION} (a full Redis then refuses writes, which "
                        "django-rtq retries), or give the tasks a Redis of their own; to accept losing "
                        f"tasks, set {ALLOW_SETTING} = True. See docs/redis.md."
                    ),
                )
            )
        persists = config.persists
        if persists is False:
            found.append(
                Finding(
                    kind=NOT_PERSISTENT,
                    node=node,
                    message=(
                        f"Redis at {node} keeps nothing over a restart (no append-only file, no RDB "
                        "save points): a restart loses every task it holds, pending, scheduled, "
                        "retrying, running (their leases) and archived, with workflows' state and "
                        "uniqueness locks."
                    ),
                    hint="Turn on appendonly yes (appendfsync everysec or always). See docs/redis.md.",
                )
            )
        unknown = []
        if policy is None:
            unknown.append("whether it evicts keys when full (maxmemory-policy)")
        if persists is None:
            unknown.append("whether it keeps its data over a restart (AOF or RDB save points)")
        if unknown:
            how = f"CONFIG GET is refused ({config.refused}) and INFO does not say" if config.refused else ""
            found.append(
                Finding(
                    kind=UNREADABLE,
                    node=node,
                    message=f"django-rtq cannot tell {' nor '.join(unknown)} of Redis at {node}"
                    + (f": {how}." if how else "."),
                    hint=f"Make sure maxmemory-policy is {NOEVICTION} and persistence is on (a managed "
                    "Redis sets these in its parameter group). See docs/redis.md.",
                )
            )
    return found


@dataclass(frozen=True, slots=True)
class Master:
    """One master: how it is named in messages, and a client of its own."""

    name: str
    client: Any


def masters(client: Any) -> list[Master]:
    """The masters behind a client: every primary of a Cluster; the server (or Sentinel's
    master) of a plain client."""
    if isinstance(client, RedisCluster):
        return [Master(node.name, client.get_redis_connection(node)) for node in client.get_primaries()]
    return [Master(node_name(client), client)]


def node_name(client: Any) -> str:
    """How a plain client's server is named in messages."""
    pool = client.connection_pool
    service = getattr(pool, "service_name", None)
    if service:
        return f"the master of Sentinel service {service!r}"
    kwargs = pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def read_configs(client: Any) -> list[ServerConfig]:
    """Read every master's configuration. Redis's absence raises BrokerUnavailable; a refused
    command (CONFIG renamed or denied by an ACL, as managed services do) does not."""
    with translate_errors():
        return [read_config(master) for master in masters(client)]


def read_config(master: Master) -> ServerConfig:
    try:
        version = master.client.info("server").get("redis_version")
    except redis.ResponseError:
        version = None
    try:
        pipe = master.client.pipeline(transaction=False)
        for name in ("maxmemory-policy", "appendonly", "save"):
            pipe.config_get(name)
        policy, aof, save = pipe.execute()
    except redis.ResponseError as exc:
        refused = str(exc)
    else:
        return ServerConfig(
            node=master.name,
            eviction_policy=policy.get("maxmemory-policy"),
            aof=aof["appendonly"] == "yes" if "appendonly" in aof else None,
            save_points=save.get("save"),
            version=version,
        )
    try:
        memory, persistence = master.client.info("memory"), master.client.info("persistence")
    except redis.ResponseError:
        return ServerConfig(node=master.name, refused=refused, version=version)
    aof_enabled = persistence.get("aof_enabled")
    return ServerConfig(
        node=master.name,
        eviction_policy=memory.get("maxmemory_policy"),
        aof=None if aof_enabled is None else bool(int(aof_enabled)),
        refused=refused,
        version=version,
    )


# The restart marker: a key each master holds while it keeps its data (worker/redis_watch.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerRun:
    """A master's run (its run_id changes with each start) and its marker, as last read."""

    node: str
    run_id: str
    marker: str | None  # the run_id the master's marker was written under; None: gone


def read_runs(client: Any, keys: Keyspace) -> list[ServerRun]:
    """Each master's run_id (INFO server) and marker, one round trip per master; the marker is
    written, under the current run_id, where it is missing. Redis's absence raises
    BrokerUnavailable."""
    runs = []
    with translate_errors():
        for master, key in marker_keys(client, keys):
            pipe = master.client.pipeline(transaction=False)
            pipe.info("server")
            pipe.get(key)
            server, marker = pipe.execute()
            run_id = server["run_id"]
            if marker is None:
                master.client.set(key, run_id, nx=True)
            runs.append(ServerRun(node=master.name, run_id=run_id, marker=marker))
    return runs


def marker_keys(client: Any, keys: Keyspace) -> list[tuple[Master, str]]:
    """Each master with its marker's key: on a Cluster, one whose hash tag lands in a slot of
    that master."""
    found = masters(client)
    if not isinstance(client, RedisCluster):
        return [(found[0], keys.server_marker())]
    wanted = {master.name: master for master in found}
    tagged: list[tuple[Master, str]] = []
    for number in itertools.count():
        if not wanted or number >= MAX_TAG_TRIES:
            break
        key = keys.server_marker(f"marker-{number}")
        owner = client.get_node_from_key(key).name
        if owner in wanted:
            tagged.append((wanted.pop(owner), key))
    return tagged


def node_of_queue(client: Any, keys: Keyspace, queue: str) -> str | None:
    """The name of the master that holds a queue (of a Cluster); None for a plain client."""
    if not isinstance(client, RedisCluster):
        return None
    return client.get_node_from_key(keys.queue(queue).pending).name

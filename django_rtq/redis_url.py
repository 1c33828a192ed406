"""Redis connection URLs (plain, Sentinel, Cluster): parsed without I/O, then turned into a client."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import redis
import redis.cluster
import redis.connection
import redis.sentinel
from django.core.exceptions import ImproperlyConfigured

Mode = Literal["standalone", "sentinel", "cluster"]
Client = redis.Redis | redis.cluster.RedisCluster

PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_REDIS_PORT = 6379
#: Query options of a Sentinel URL that configure the connections to the sentinels themselves.
SENTINEL_QUERY_OPTIONS = {"sentinel_username": "username", "sentinel_password": "password"}

_USERINFO = re.compile(r"^(?P<user>[^:]*)(?::(?P<password>.*))?$")
_ADDRESS = re.compile(r"\[(?P<v6>[^\]]+)\](?::(?P<port6>[^:]*))?|(?P<host>[^:\[\]]+)(?::(?P<port>[^:]*))?")


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTarget:
    """Where and how to connect: one server, a Sentinel-monitored master, or a cluster."""

    mode: Mode
    url: str = ""  # standalone: the redis://, rediss:// or unix:// URL, handed to redis-py
    nodes: tuple[tuple[str, int], ...] = ()  # the sentinels, or the cluster's startup nodes
    service: str = ""  # sentinel: the name of the monitored master
    options: dict[str, Any] = field(default_factory=dict)  # client keyword arguments
    sentinel_options: dict[str, Any] = field(default_factory=dict)  # for connections to sentinels

    def with_options(self, **options: Any) -> RedisTarget:
        """Return this target with more client options (they win over those it has)."""
        return RedisTarget(
            mode=self.mode,
            url=self.url,
            nodes=self.nodes,
            service=self.service,
            options={**self.options, **options},
            sentinel_options=self.sentinel_options,
        )

    def describe(self) -> str:
        """A password-free description for messages and logs."""
        if self.mode == "standalone":
            return redact(self.url)
        nodes = ",".join(f"{host}:{port}" for host, port in self.nodes)
        if self.mode == "sentinel":
            return f"Sentinel service {self.service!r} via {nodes}"
        return f"Redis Cluster via {nodes}"


def parse_url(url: str) -> RedisTarget:
    """Read a connection URL; raise ImproperlyConfigured naming what is wrong with it."""
    if not isinstance(url, str) or not url:
        raise ImproperlyConfigured(f"The Redis URL must be a non-empty string, not {url!r}.")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in PLAIN_SCHEMES:
        return _parse_plain(url)
    if scheme in SENTINEL_SCHEMES:
        return _parse_sentinel(url)
    if scheme in CLUSTER_SCHEMES:
        return _parse_cluster(url)
    known = ", ".join(f"{s}://" for s in (*PLAIN_SCHEMES, *SENTINEL_SCHEMES, *CLUSTER_SCHEMES))
    raise ImproperlyConfigured(f"Redis URL {redact(url)!r} has an unknown scheme; expected one of {known}.")


def connect(target: RedisTarget, **options: Any) -> Client:
    """Build a client decoding replies to str. Only a cluster client talks to Redis here."""
    options = {**target.options, **options}
    if options.pop("decode_responses", True) is not True:
        raise ImproperlyConfigured("decode_responses cannot be turned off: django-rtq reads replies as str.")
    # A value that is not UTF-8 (corrupt data) reads as a str with its bad bytes escaped, for the
    # worker to reject, instead of failing the whole reply it is part of (a claim of many tasks).
    options.setdefault("encoding_errors", "surrogateescape")
    if target.mode == "cluster":
        nodes = [redis.cluster.ClusterNode(host, port) for host, port in target.nodes]
        return redis.cluster.RedisCluster(startup_nodes=nodes, decode_responses=True, **options)
    if target.mode == "sentinel":
        # The sentinels get the socket options of the master's connections, and TLS with it.
        sentinel_options = {k: v for k, v in options.items() if k.startswith("socket_") or k == "ssl"}
        sentinel = redis.sentinel.Sentinel(
            list(target.nodes), sentinel_kwargs={**sentinel_options, **target.sentinel_options}
        )
        return sentinel.master_for(target.service, decode_responses=True, **options)
    pool_class = options.pop("connection_pool_class", None) or redis.ConnectionPool
    return redis.Redis(connection_pool=pool_class.from_url(target.url, decode_responses=True, **options))


def close_client(client: Any) -> None:
    """Close a client from `connect`, with its pool and, for Sentinel, the sentinel connections."""
    client.close()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()
        sentinel = getattr(pool, "sentinel_manager", None)
        if sentinel is not None:
            for sentinel_client in sentinel.sentinels:
                sentinel_client.close()


def redact(url: str) -> str:
    """Return the URL with its password replaced by ***."""
    return re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", url) if isinstance(url, str) else repr(url)


def _parse_plain(url: str) -> RedisTarget:
    try:
        redis.connection.parse_url(url)
        path = urlsplit(url).path.strip("/")
    except ValueError as exc:
        raise ImproperlyConfigured(f"Redis URL {redact(url)!r} is invalid: {exc}") from None
    if not url.lower().startswith("unix:") and path and not path.isdigit():
        raise ImproperlyConfigured(
            f"Redis URL {redact(url)!r} is invalid: the path must be a database number, not {path!r}."
        )
    return RedisTarget(mode="standalone", url=url)


def _parse_sentinel(url: str) -> RedisTarget:
    """redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?options]"""
    scheme, netloc, path, query = _split(url)
    options, sentinel_options = _credentials(netloc), {}
    for name, value in query_options(query, url).items():
        if name in SENTINEL_QUERY_OPTIONS:
            sentinel_options[SENTINEL_QUERY_OPTIONS[name]] = value
        else:
            options[name] = value
    parts = [unquote(part) for part in path.strip("/").split("/")] if path.strip("/") else []
    if not parts or not parts[0] or len(parts) > 2:
        raise ImproperlyConfigured(
            f"Redis URL {redact(url)!r} is invalid: its path must be /<service name> or "
            "/<service name>/<db>, the name of the master the sentinels monitor."
        )
    if len(parts) == 2:
        options["db"] = _db(parts[1], url)
    if scheme == "rediss+sentinel":
        options["ssl"] = True
    return RedisTarget(
        mode="sentinel",
        nodes=_nodes(netloc, DEFAULT_SENTINEL_PORT, url),
        service=parts[0],
        options=options,
        sentinel_options=sentinel_options,
    )


def _parse_cluster(url: str) -> RedisTarget:
    """redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0][?options]"""
    scheme, netloc, path, query = _split(url)
    options = {**_credentials(netloc), **query_options(query, url)}
    db = options.pop("db", None)
    if path.strip("/"):
        db = _db(path.strip("/"), url)
    if db not in (None, 0):
        raise ImproperlyConfigured(f"Redis URL {redact(url)!r} is invalid: a cluster only has database 0.")
    if scheme == "rediss+cluster":
        options["ssl"] = True
    return RedisTarget(mode="cluster", nodes=_nodes(netloc, DEFAULT_REDIS_PORT, url), options=options)


def _split(url: str) -> tuple[str, str, str, str]:
    # urlsplit would read "host1:1,host2:2" as one host with a bad port: split by hand.
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    rest = rest.partition("#")[0]
    netloc, slash, path = rest.partition("/")
    return scheme.lower(), netloc, slash + path, query


def _credentials(netloc: str) -> dict[str, Any]:
    userinfo, at, _ = netloc.rpartition("@")
    if not at:
        return {}
    match = _USERINFO.match(userinfo)
    assert match is not None  # the pattern matches any string
    credentials = {}
    if match["user"]:
        credentials["username"] = unquote(match["user"])
    if match["password"]:
        credentials["password"] = unquote(match["password"])
    return credentials


def _nodes(netloc: str, default_port: int, url: str) -> tuple[tuple[str, int], ...]:
    hosts = netloc.rpartition("@")[2]
    if not hosts.strip():
        raise ImproperlyConfigured(f"Redis URL {redact(url)!r} is invalid: it names no host.")
    nodes = []
    for address in hosts.split(","):
        address = address.strip()
        match = _ADDRESS.fullmatch(address)
        if not match:
            raise ImproperlyConfigured(
                f"Redis URL {redact(url)!r} is invalid: {address!r} is not host, host:port or [ipv6]:port."
            )
        host = match["v6"] or match["host"]
        port = match["port6"] if match["v6"] else match["port"]
        if port is None:
            nodes.append((host, default_port))
        elif port.isdigit() and 0 < int(port) < 65536:
            nodes.append((host, int(port)))
        else:
            raise ImproperlyConfigured(f"Redis URL {redact(url)!r} is invalid: port {port!r} of {host}.")
    return tuple(nodes)


def query_options(query: str, url: str) -> dict[str, Any]:
    """Read query options the way redis-py reads those of a redis:// URL."""
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=False):
        parser = redis.connection.URL_QUERY_ARGUMENT_PARSERS.get(name)
        try:
            options[name] = parser(value) if parser else value
        except (TypeError, ValueError):
            raise ImproperlyConfigured(
                f"Redis URL {redact(url)!r} is invalid: bad value for {name!r}: {value!r}."
            ) from None
    return options


def _db(text: str, url: str) -> int:
    if not text.isdigit():
        raise ImproperlyConfigured(
            f"Redis URL {redact(url)!r} is invalid: the database must be a number, not {text!r}."
        )
    return int(text)

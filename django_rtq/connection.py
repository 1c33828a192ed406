"""The process-wide Redis client and broker, built lazily from settings."""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string
from redis.exceptions import RedisClusterException, RedisError

from .broker import Broker
from .broker.clock import ServerClock
from .broker.limits import FlowLimits, LimitsSource, no_limits
from .conf import RTQSettings, get_settings
from .exceptions import BrokerUnavailable
from .redis_url import Client, RedisTarget, close_client, connect, parse_url, query_options, redact

DJANGO_REDIS_BACKEND = "django_redis.cache.RedisCache"
DJANGO_BACKEND = "django.core.cache.backends.redis.RedisCache"

_lock = threading.Lock()
_broker: Broker | None = None
#: time.monotonic() until which this process takes Redis for away (see note_redis_away)
_away_until = 0.0


def redis_client(url: str, **options: Any) -> Client:
    """Return a client for any URL form of docs/redis.md, decoding replies to str."""
    return connect(parse_url(url), **options)


def redis_target(conf: RTQSettings | None = None) -> RedisTarget:
    """Say where the process's client connects (REDIS_URL or CACHE_ALIAS, plus REDIS_OPTIONS); no I/O."""
    conf = conf or get_settings()
    if not isinstance(conf.REDIS_OPTIONS, dict):
        raise ImproperlyConfigured(
            f"RTQ['REDIS_OPTIONS'] must be a dict of redis-py client arguments, not {conf.REDIS_OPTIONS!r}."
        )
    if conf.REDIS_OPTIONS.get("decode_responses", True) is not True:
        raise ImproperlyConfigured(
            "RTQ['REDIS_OPTIONS'] cannot turn decode_responses off: replies are read as str."
        )
    target = cache_target(conf.CACHE_ALIAS) if conf.CACHE_ALIAS else parse_url(conf.REDIS_URL)
    return target.with_options(**conf.REDIS_OPTIONS)


def cache_target(alias: str) -> RedisTarget:
    """Read the connection settings of a Redis cache in settings.CACHES (django-redis or Django's)."""
    caches = getattr(django_settings, "CACHES", {})
    if alias not in caches:
        raise ImproperlyConfigured(
            f"RTQ['CACHE_ALIAS'] is {alias!r}, but settings.CACHES has no such cache "
            f"(it has {', '.join(map(repr, caches)) or 'none'})."
        )
    config = caches[alias]
    backend = config.get("BACKEND", "")
    kind = _redis_cache_kind(backend, alias)
    separators = "," if kind == "django-redis" else "[;,]"  # as each backend splits LOCATION
    location = config.get("LOCATION") or ""
    locations = re.split(separators, location) if isinstance(location, str) else list(location)
    location = str(locations[0]).strip() if locations else ""
    if not location:
        raise ImproperlyConfigured(f"CACHES[{alias!r}] has no LOCATION, so django-rtq cannot connect.")
    options = dict(config.get("OPTIONS") or {})
    try:
        if kind == "django-redis":
            return _django_redis_target(location, options, alias)
        return _django_cache_target(location, options)
    except ImproperlyConfigured as exc:
        raise ImproperlyConfigured(f"CACHES[{alias!r}] (RTQ['CACHE_ALIAS']): {exc}") from None


def _redis_cache_kind(backend: str, alias: str) -> str:
    """Return "django-redis" or "django" for a Redis cache backend (or a subclass); refuse others."""
    if backend == DJANGO_REDIS_BACKEND:
        return "django-redis"
    if backend == DJANGO_BACKEND:
        return "django"
    try:
        backend_class = import_string(backend)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"CACHES[{alias!r}] has a BACKEND that cannot be imported: {exc}"
        ) from None
    for path, kind in ((DJANGO_REDIS_BACKEND, "django-redis"), (DJANGO_BACKEND, "django")):
        try:
            base = import_string(path)
        except ImportError:
            continue
        if isinstance(backend_class, type) and issubclass(backend_class, base):
            return kind
    raise ImproperlyConfigured(
        f"RTQ['CACHE_ALIAS'] is {alias!r}, but that cache uses {backend}, not a Redis cache "
        f"({DJANGO_REDIS_BACKEND} or {DJANGO_BACKEND})."
    )


# django-redis OPTIONS that are connection settings, and the redis-py argument each one is
_DJANGO_REDIS_OPTIONS = {
    "USERNAME": "username",
    "PASSWORD": "password",
    "SOCKET_TIMEOUT": "socket_timeout",
    "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
}


def _django_redis_target(location: str, options: dict[str, Any], alias: str) -> RedisTarget:
    kwargs = {name: options[key] for key, name in _DJANGO_REDIS_OPTIONS.items() if options.get(key)}
    kwargs.update(options.get("CONNECTION_POOL_KWARGS") or {})
    if options.get("SENTINELS") or str(options.get("CLIENT_CLASS", "")).endswith(".SentinelClient"):
        return _django_redis_sentinel_target(location, options, kwargs)
    if options.get("CONNECTION_POOL_CLASS"):
        kwargs["connection_pool_class"] = _import(options["CONNECTION_POOL_CLASS"], "CONNECTION_POOL_CLASS")
    return parse_url(location).with_options(**kwargs)


def _django_redis_sentinel_target(
    location: str, options: dict[str, Any], kwargs: dict[str, Any]
) -> RedisTarget:
    """django-redis's Sentinel set-up: LOCATION redis://<service>/<db>, OPTIONS["SENTINELS"]."""
    sentinels = options.get("SENTINELS")
    if not sentinels:
        raise ImproperlyConfigured("its SentinelClient needs OPTIONS['SENTINELS'], a list of (host, port).")
    try:
        nodes = tuple((str(host), int(port)) for host, port in sentinels)
    except (TypeError, ValueError):
        raise ImproperlyConfigured(
            f"OPTIONS['SENTINELS'] must be a list of (host, port), not {sentinels!r}."
        ) from None
    # django-redis reads the service name from the URL's host; the URL's path, password and
    # query still apply to the master's connections.
    parts = urlsplit(location)
    service = parts.netloc.rpartition("@")[2].split(":")[0]
    db = parts.path.strip("/")
    if parts.scheme not in ("redis", "rediss") or not service or not (db.isdigit() or not db):
        raise ImproperlyConfigured(
            f"LOCATION {redact(location)!r} must be redis://<service name>[/<db>] for Sentinel."
        )
    from_url = query_options(parts.query, location)
    from_url.pop("is_master", None)
    if parts.username:
        from_url["username"] = unquote(parts.username)
    if parts.password:
        from_url["password"] = unquote(parts.password)
    if db:
        from_url["db"] = int(db)
    if parts.scheme == "rediss":
        from_url["ssl"] = True
    return RedisTarget(
        mode="sentinel",
        nodes=nodes,
        service=service,
        options={**from_url, **kwargs},
        sentinel_options=dict(options.get("SENTINEL_KWARGS") or {}),
    )


def _django_cache_target(location: str, options: dict[str, Any]) -> RedisTarget:
    """Django's own RedisCache passes its OPTIONS, less serializer and classes, to the pool."""
    options.pop("serializer", None)
    pool_class = options.pop("pool_class", None)
    if pool_class:
        options["connection_pool_class"] = _import(pool_class, "pool_class")
    if options.get("parser_class"):
        options["parser_class"] = _import(options["parser_class"], "parser_class")
    return parse_url(location).with_options(**options)


def _import(path: Any, option: str) -> Any:
    if not isinstance(path, str):
        return path
    try:
        return import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"OPTIONS[{option!r}] cannot be imported: {exc}") from None


_limits_source: LimitsSource = no_limits


def get_broker() -> Broker:
    """Return this process's broker, creating it from settings on first use."""
    global _broker
    if _broker is None:
        with _lock:
            if _broker is None:
                conf = get_settings()
                target = redis_target(conf)
                try:
                    client = connect(target)
                except (RedisError, RedisClusterException) as exc:  # a cluster client connects at once
                    raise BrokerUnavailable(f"Redis is unreachable ({target.describe()}): {exc}") from exc
                _broker = broker_for(client, conf)
    return _broker


def broker_for(client: Any, conf: RTQSettings | None = None) -> Broker:
    """A broker over `client`, configured from settings (key prefix, counters, leases, mirror)
    and applying the project's flow-control limits."""
    conf = conf or get_settings()
    broker = Broker(
        client,
        prefix=conf.KEY_PREFIX,
        counter_ttl=int(conf.STATS_TTL),
        lease_seconds=conf.LEASE_SECONDS,
        mirror=conf.MIRROR,
    )
    broker.limits = _limits
    return broker


def use_limits(source: LimitsSource) -> None:
    """Make the brokers of this module apply the limits `source` returns (the app's ready()
    passes the project's: django_rtq/flow_control.py, which reads the registry, above this module)."""
    global _limits_source
    _limits_source = source


def _limits() -> FlowLimits:
    return _limits_source()


def set_broker(broker: Broker) -> None:
    """Make `broker` this process's broker until `reset_broker()` (django_rtq.testing's fake Redis)."""
    global _broker, _away_until
    with _lock:
        _broker = broker
        _away_until = 0.0


def reset_broker() -> None:
    """Forget the broker, so the next use builds it anew (after a fork or a settings change)."""
    global _broker, _away_until
    broker, _broker = _broker, None
    _away_until = 0.0
    if broker is not None:
        close_client(broker.client)


def note_redis_away(seconds: float) -> bool:
    """Take Redis for away for `seconds` from now: the transactional outbox leaves its tasks to
    the workers' relays meanwhile, rather than have each request wait out the client's retries.
    Return whether Redis was taken for reachable until now (the first to notice warns)."""
    global _away_until
    first = not redis_recently_away()
    _away_until = time.monotonic() + seconds
    return first


def redis_recently_away() -> bool:
    """Whether a send found Redis away moments ago (see note_redis_away)."""
    return time.monotonic() < _away_until


def queue_time() -> float:
    """Now on the queue's clock (the Redis server's, broker/clock.py), which the times an enqueue
    reckons from now (a delay, a deadline as a timedelta) are reckoned on. While a send found
    Redis away moments ago, by the offset learned last rather than after another wait."""
    clock = get_broker().clock
    if isinstance(clock, ServerClock) and redis_recently_away():
        return clock.last_known()
    return clock()


@receiver(setting_changed)
def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("RTQ", "CACHES"):
        reset_broker()


# A forked child must not share its parent's sockets.
os.register_at_fork(after_in_child=lambda: globals().update(_broker=None, _away_until=0.0))

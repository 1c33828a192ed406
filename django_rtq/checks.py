"""System checks: settings.RTQ, the Redis connection settings, settings.TASKS queues, and Redis itself.

All are tagged "django_rtq". Only `check_redis_reachable` does network I/O, so it is a deployment
check (`manage.py check --deploy`), tagged "redis" too: `manage.py check --deploy --tag redis`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import RTQSettings, get_settings, validate_queue_name
from .connection import redis_target
from .redis_url import close_client, connect

TAG = "django_rtq"
REDIS_TAG = "redis"
#: Seconds the deployment check waits for Redis to connect and to answer PING.
PING_TIMEOUT_SECONDS = 3.0
#: redis-py's errors can carry a whole connection pool's repr; a check message shows this much.
MAX_ERROR_CHARS = 300


def _settings() -> RTQSettings | None:
    try:
        return get_settings()
    except (ImproperlyConfigured, TypeError, ValueError):
        return None


@checks.register(TAG)
def check_rtq_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: settings.RTQ is not valid."""
    try:
        get_settings()
    except (ImproperlyConfigured, TypeError, ValueError) as exc:
        return [checks.Error(f"settings.RTQ is invalid: {exc}", obj="settings.RTQ", id="django_rtq.E001")]
    return []


@checks.register(TAG)
def check_connection_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E002: REDIS_URL or REDIS_OPTIONS is invalid; E003: CACHE_ALIAS is unusable; W002: both set."""
    conf = _settings()
    if conf is None:
        return []  # E001 says why
    try:
        redis_target(conf)
    except ImproperlyConfigured as exc:
        cache_problem = conf.CACHE_ALIAS and isinstance(conf.REDIS_OPTIONS, dict)
        return [
            checks.Error(
                str(exc),
                hint="See docs/redis.md for the connection settings django-rtq understands.",
                obj="settings.RTQ",
                id="django_rtq.E003" if cache_problem else "django_rtq.E002",
            )
        ]
    if conf.CACHE_ALIAS and "REDIS_URL" in (getattr(settings, "RTQ", None) or {}):
        return [
            checks.Warning(
                f"RTQ['REDIS_URL'] is ignored: RTQ['CACHE_ALIAS'] ({conf.CACHE_ALIAS!r}) takes precedence.",
                hint="Remove one of the two.",
                obj="settings.RTQ",
                id="django_rtq.W002",
            )
        ]
    return []


@checks.register(TAG)
def check_tasks_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E004: a django-rtq backend in settings.TASKS lists a bad queue; W001: one no worker serves."""
    backends = getattr(settings, "TASKS", None)
    if not isinstance(backends, dict):
        return []
    conf = _settings()
    messages: list[checks.CheckMessage] = []
    for alias, config in backends.items():
        if not isinstance(config, dict) or not str(config.get("BACKEND", "")).startswith("django_rtq."):
            continue
        where = f"settings.TASKS[{alias!r}]"
        queues = config.get("QUEUES")
        if queues is None:
            continue
        if isinstance(queues, str | bytes) or not isinstance(queues, list | tuple | set | frozenset):
            messages.append(
                checks.Error(
                    f"QUEUES must be a list of queue names, not {queues!r}.", obj=where, id="django_rtq.E004"
                )
            )
            continue
        for name in queues:
            try:
                validate_queue_name(name if isinstance(name, str) else "")
            except ImproperlyConfigured as exc:
                messages.append(checks.Error(str(exc), obj=where, id="django_rtq.E004"))
                continue
            if conf is not None and name not in conf.QUEUES:
                messages.append(
                    checks.Warning(
                        f"Queue {name!r} is not in RTQ['QUEUES'], so workers started without --queues "
                        "do not serve it.",
                        hint=f"Add {name!r} to RTQ['QUEUES'], or run an rtq_worker with --queues naming it.",
                        obj=where,
                        id="django_rtq.W001",
                    )
                )
    return messages


@checks.register(TAG, REDIS_TAG, deploy=True)
def check_redis_reachable(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W003 (deployment only): Redis does not answer PING."""
    conf = _settings()
    if conf is None:
        return []
    try:
        target = redis_target(conf)
    except ImproperlyConfigured:
        return []  # E002 or E003 says why
    timeouts = {"socket_connect_timeout": PING_TIMEOUT_SECONDS, "socket_timeout": PING_TIMEOUT_SECONDS}
    client = None
    try:
        client = connect(target, **timeouts)  # a cluster client connects here already
        client.ping()
    except Exception as exc:  # any failure to reach Redis, whatever redis-py calls it
        return [
            checks.Warning(
                f"Redis is unreachable ({target.describe()}): {_shorten(str(exc))}",
                hint="Workers and enqueueing need it; check RTQ['REDIS_URL'] or RTQ['CACHE_ALIAS'].",
                obj="settings.RTQ",
                id="django_rtq.W003",
            )
        ]
    finally:
        if client is not None:
            close_client(client)
    return []


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"

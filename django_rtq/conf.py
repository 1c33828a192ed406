"""Settings: the `RTQ` dict in Django settings, merged over documented defaults."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, fields
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import defaults
from .broker.limits import Limit, make_limit


@dataclass(frozen=True, slots=True, kw_only=True)
class RTQSettings:
    """The effective settings, read from `settings.RTQ` with defaults for every key."""

    REDIS_URL: str = ""
    # extra keyword arguments for the redis-py client (socket timeouts, ssl options, ...)
    REDIS_OPTIONS: dict[str, Any] = field(default_factory=dict)
    # alias of a django-redis cache whose connection settings to use instead of REDIS_URL
    CACHE_ALIAS: str | None = None
    KEY_PREFIX: str = defaults.DEFAULT_KEY_PREFIX
    # queue name -> weight; workers started without --queues serve these
    QUEUES: dict[str, int] = field(default_factory=lambda: {defaults.DEFAULT_QUEUE: 1})
    DEFAULT_QUEUE: str = defaults.DEFAULT_QUEUE
    STRICT_PRIORITY: bool = False
    # queue name -> {"rate_limit": "100/m", "burst": 10, "max_concurrency": 5}: limits every task
    # of the queue counts against, across all workers (docs/flow-control.md); parsed into Limits
    QUEUE_LIMITS: dict[str, Limit] = field(default_factory=dict)
    CONCURRENCY: int = defaults.DEFAULT_CONCURRENCY
    MAX_RETRIES: int = defaults.DEFAULT_MAX_RETRIES
    TIMEOUT: float | None = defaults.DEFAULT_TIMEOUT_SECONDS
    RETENTION: float = defaults.DEFAULT_RETENTION_SECONDS
    UNIQUE_TTL: float = defaults.DEFAULT_UNIQUE_TTL_SECONDS
    # callable or dotted path: (retried: int, exc: BaseException) -> seconds
    RETRY_BACKOFF: Any = "django_rtq.retry.exponential_backoff"
    LEASE_SECONDS: float = defaults.DEFAULT_LEASE_SECONDS
    RECOVERY_GRACE: float = defaults.DEFAULT_RECOVERY_GRACE_SECONDS
    HEARTBEAT_INTERVAL: float = defaults.DEFAULT_HEARTBEAT_INTERVAL_SECONDS
    # a task whose worker died while running it more often than this is archived (WorkerLost)
    MAX_RECOVERIES: int = defaults.DEFAULT_MAX_RECOVERIES
    # a task whose handler raised Snooze more often than this is archived (TooManySnoozes)
    MAX_SNOOZES: int = defaults.DEFAULT_MAX_SNOOZES
    FORWARDER_INTERVAL: float = defaults.DEFAULT_FORWARDER_INTERVAL_SECONDS
    RECOVERER_INTERVAL: float = defaults.DEFAULT_RECOVERER_INTERVAL_SECONDS
    JANITOR_INTERVAL: float = defaults.DEFAULT_JANITOR_INTERVAL_SECONDS
    HEALTHCHECK_INTERVAL: float = defaults.DEFAULT_HEALTHCHECK_INTERVAL_SECONDS
    SYNCER_INTERVAL: float = defaults.DEFAULT_SYNCER_INTERVAL_SECONDS
    SHUTDOWN_TIMEOUT: float = defaults.DEFAULT_SHUTDOWN_TIMEOUT_SECONDS
    IDLE_WAIT: float = defaults.DEFAULT_IDLE_WAIT_SECONDS
    ARCHIVE_MAX_SIZE: int = defaults.DEFAULT_ARCHIVE_MAX_SIZE
    ARCHIVE_MAX_AGE: float = defaults.DEFAULT_ARCHIVE_MAX_AGE_SECONDS
    # seconds tasks no worker can run (an unknown type, a newer format, arguments that do not
    # fit) wait with no worker taking them before they are archived (docs/deploying.md)
    NO_WORKER_GRACE: float = defaults.DEFAULT_NO_WORKER_GRACE_SECONDS
    STATS_TTL: float = defaults.DEFAULT_STATS_TTL_SECONDS
    # seconds a queue the project names nowhere stays listed once nothing uses it: the janitor
    # then forgets it (docs/commands.md#rtq_forget_queue); None = never
    FORGET_EMPTY_QUEUES_AFTER: float | None = defaults.DEFAULT_FORGET_EMPTY_QUEUES_AFTER_SECONDS
    # accept a Redis whose maxmemory-policy evicts keys (and so loses tasks when full): workers
    # refuse to start on one otherwise (docs/redis.md)
    ALLOW_EVICTING_REDIS: bool = False
    # dotted path or callable, called with (healthy: bool, error: Exception | None)
    HEALTH_CHECK: Any = None
    # a file the worker rewrites every HEALTHCHECK_INTERVAL while all its threads live, for
    # `python -m django_rtq.probe live|ready` (docs/deploying.md#probes); rtq_worker --health-file
    HEALTH_FILE: str | None = None
    # a line per successful task at INFO on the "django_rtq.tasks" logger (failures always get one)
    LOG_FINISHED_TASKS: bool = True
    # the ORM mirror of finished tasks (django_rtq.models.FinishedTask)
    MIRROR: bool = True
    MIRROR_INTERVAL: float = defaults.DEFAULT_MIRROR_INTERVAL_SECONDS
    MIRROR_BATCH_SIZE: int = defaults.DEFAULT_MIRROR_BATCH_SIZE
    # seconds a mirrored row is kept: the workers delete older ones (docs/settings.md); None = never
    MIRROR_MAX_AGE: float | None = defaults.DEFAULT_MIRROR_MAX_AGE_SECONDS
    # seconds between two of those pruning passes, across all workers
    MIRROR_PRUNE_INTERVAL: float = defaults.DEFAULT_MIRROR_PRUNE_INTERVAL_SECONDS
    MIRROR_DATABASE: str = "default"
    # modules of task types to import at start-up besides each installed app's `tasks`
    # (django_rtq/discovery.py): where a task type whose name is not its path is defined
    TASK_MODULES: list[str] = field(default_factory=list)
    # periodic tasks: name -> {"task": ..., "cron": ... | "every": seconds, "args", "kwargs", ...}
    PERIODIC: dict[str, dict[str, Any]] = field(default_factory=dict)
    SCHEDULER_INTERVAL: float = defaults.DEFAULT_SCHEDULER_INTERVAL_SECONDS
    # workflows: seconds between a worker's looks for commands no one applied yet
    COMMAND_INTERVAL: float = defaults.DEFAULT_COMMAND_INTERVAL_SECONDS
    # the REST API (django_rtq.api): DRF classes as dotted paths; None = DRF's authentication
    # classes and django-rtq's permissions (RTQPermissions: see docs/api.md)
    API_AUTHENTICATION_CLASSES: list[str] | None = None
    API_PERMISSION_CLASSES: list[str] | None = None
    API_PAGE_SIZE: int = 50
    # the transactional outbox (docs/reliability.md): enqueue_on_commit() stores its task in the
    # transaction, sends it after the commit, and workers relay what that send could not deliver
    OUTBOX: bool = True
    # plain enqueue() stores its tasks in the outbox, instead of raising, while Redis is away
    OUTBOX_FALLBACK: bool = False
    # the database the outbox's rows go to: the one your own writes go to
    OUTBOX_DATABASE: str = "default"
    OUTBOX_RELAY_AFTER: float = defaults.DEFAULT_OUTBOX_RELAY_AFTER_SECONDS
    OUTBOX_RELAY_INTERVAL: float = defaults.DEFAULT_OUTBOX_RELAY_INTERVAL_SECONDS
    # OpenTelemetry (the otel extra; docs/tracing.md): None carries the trace context of an
    # enqueue made while a span is active, True of every enqueue (one outside a span starts a
    # trace), False turns tracing off (nothing of OpenTelemetry is imported)
    TRACING: bool | None = None


@functools.cache
def get_settings() -> RTQSettings:
    """Return the effective settings, validating `settings.RTQ` (read once; see clear below)."""
    user = getattr(django_settings, "RTQ", {}) or {}
    if not isinstance(user, dict):
        raise ImproperlyConfigured("settings.RTQ must be a dict.")
    known = {f.name for f in fields(RTQSettings)}
    unknown = sorted(set(user) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"Unknown key(s) in settings.RTQ: {', '.join(unknown)}. Known keys: {', '.join(sorted(known))}."
        )
    values = dict(user)
    values.setdefault("REDIS_URL", os.environ.get("RTQ_REDIS_URL") or defaults.DEFAULT_REDIS_URL)
    queues = values.get("QUEUES")
    if queues is not None:
        values["QUEUES"] = parse_queues(queues)
    modules = values.get("TASK_MODULES", [])
    if (
        isinstance(modules, str)
        or not isinstance(modules, list | tuple)
        or not all(isinstance(name, str) and name for name in modules)
    ):
        raise ImproperlyConfigured(
            f"settings.RTQ['TASK_MODULES'] must be a list of module paths, not {modules!r}."
        )
    if "QUEUE_LIMITS" in values:
        values["QUEUE_LIMITS"] = parse_queue_limits(values["QUEUE_LIMITS"])
    if not any(values.get("TRACING") is allowed for allowed in (None, True, False)):
        raise ImproperlyConfigured(
            f"settings.RTQ['TRACING'] must be None, True or False, not {values['TRACING']!r}."
        )
    return RTQSettings(**values)


@receiver(setting_changed)
def _clear_settings_cache(setting: str, **kwargs: Any) -> None:
    if setting == "RTQ":
        get_settings.cache_clear()


def parse_queues(queues: Any) -> dict[str, int]:
    """Turn a dict, a list of names, or a "name:weight,name" string into {queue: weight}."""
    if isinstance(queues, str):
        queues = [part for part in queues.split(",") if part.strip()]
    if isinstance(queues, dict):
        items = list(queues.items())
    else:
        items = []
        for entry in queues:
            name, _, weight = str(entry).partition(":")
            items.append((name, weight or 1))
    parsed: dict[str, int] = {}
    for name, weight in items:
        name = str(name).strip()
        validate_queue_name(name)
        try:
            weight = int(weight)
        except (TypeError, ValueError):
            raise ImproperlyConfigured(
                f"Queue {name!r} has a weight that is not an integer: {weight!r}."
            ) from None
        if weight < 1:
            raise ImproperlyConfigured(f"Queue {name!r} needs a weight of at least 1, not {weight}.")
        parsed[name] = weight
    if not parsed:
        raise ImproperlyConfigured("At least one queue is needed.")
    return parsed


LIMIT_OPTIONS = ("rate_limit", "burst", "max_concurrency")


def parse_queue_limits(limits: Any) -> dict[str, Limit]:
    """Validate `RTQ["QUEUE_LIMITS"]` ({queue: {"rate_limit": ..., "burst": ..., "max_concurrency": ...}})."""
    if not isinstance(limits, dict):
        raise ImproperlyConfigured(
            f"settings.RTQ['QUEUE_LIMITS'] must be a dict of queue name -> limits, not {limits!r}."
        )
    parsed = {}
    for queue, options in limits.items():
        where = f"settings.RTQ['QUEUE_LIMITS'][{queue!r}]"
        validate_queue_name(queue if isinstance(queue, str) else "")
        if not isinstance(options, dict) or not options or set(options) - set(LIMIT_OPTIONS):
            raise ImproperlyConfigured(
                f"{where} must be a dict of some of {', '.join(LIMIT_OPTIONS)}, not {options!r}."
            )
        try:
            limit = make_limit(**options, where=where)
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
        if limit is not None:
            parsed[queue] = limit
    return parsed


_FORBIDDEN_IN_QUEUE_NAMES = frozenset("{}: \t\n\r")


def validate_queue_name(name: str) -> None:
    """Reject queue names that would break the key layout (hash tags use braces)."""
    if not name or not _FORBIDDEN_IN_QUEUE_NAMES.isdisjoint(name):
        raise ImproperlyConfigured(
            f"Queue name {name!r} is invalid: it must be non-empty and contain no braces, colons or spaces."
        )


def rtq_task_backends() -> dict[str, dict[str, Any]]:
    """The backends of `settings.TASKS` that are django-rtq's, by alias."""
    backends = getattr(django_settings, "TASKS", None)
    if not isinstance(backends, dict):
        return {}
    return {
        alias: config
        for alias, config in backends.items()
        if isinstance(config, dict) and str(config.get("BACKEND", "")).startswith("django_rtq.")
    }

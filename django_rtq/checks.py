"""System checks: settings.RTQ, the Redis connection settings, settings.TASKS (its queues, and
whether the `django.tasks` API is installed), and Redis itself: reachable, configured not to
lose tasks (no eviction, persistence), and not shared with another project's workers under the
same key prefix.

All are tagged "django_rtq" but the tables' check (W008), a database check that Django runs
only when asked for databases (`manage.py check --database default`; silent during `migrate`).
Only `check_redis_reachable`, `check_redis_config` and `check_other_projects` do network I/O
to Redis, so they are deployment checks (`manage.py check --deploy`), tagged "redis" too:
`manage.py check --deploy --tag redis`; `check_tables_deployed` is W008's deployment form.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import Any, TypeVar

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from .broker import Broker
from .broker.inspect import Inspector
from .broker.redis_config import EVICTS, NOT_PERSISTENT, TOO_OLD, UNREADABLE, findings, read_configs
from .conf import RTQSettings, get_settings, rtq_task_backends, validate_queue_name
from .connection import redis_target
from .projects import SHARING_HINT, current_project, other_projects, sharing_problem
from .redis_url import RedisTarget, close_client, connect

TAG = "django_rtq"
REDIS_TAG = "redis"
#: What a deployment check reads from Redis.
T = TypeVar("T")
#: Seconds the deployment check waits for Redis to connect and to answer PING.
PING_TIMEOUT_SECONDS = 3.0
#: redis-py's errors can carry a whole connection pool's repr; a check message shows this much.
MAX_ERROR_CHARS = 300
#: Where `django_rtq.backends` takes the `django.tasks` API from, in this order: Django 6.0+,
#: then the django-tasks backport (Django 5.2).
TASKS_API_MODULES = ("django.tasks", "django_tasks")


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
    conf = _settings()
    messages: list[checks.CheckMessage] = []
    for alias, config in rtq_task_backends().items():
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


@checks.register(TAG)
def check_queue_names(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W004: a task type's queue is not in RTQ['QUEUES']; W005: a queue of RTQ['QUEUES'] that
    nothing names (no task type, schedule or TASKS backend, and not DEFAULT_QUEUE): a typo?
    W007: a queue of RTQ['QUEUE_LIMITS'] that the project names nowhere else: a typo?"""
    from .queue_names import queues_named_elsewhere
    from .registry import registered_tasks

    conf = _settings()
    if conf is None:
        return []
    messages: list[checks.CheckMessage] = []
    for task_type in sorted(registered_tasks().values(), key=lambda t: t.name):
        queue = task_type.options.get("queue")
        if queue and queue not in conf.QUEUES:
            messages.append(
                checks.Warning(
                    f"Task {task_type.name!r} goes to queue {queue!r}, which is not in RTQ['QUEUES']: "
                    "workers started without --queues do not serve it.",
                    hint=f"Add {queue!r} to RTQ['QUEUES'], or run an rtq_worker with --queues naming it.",
                    obj=task_type.name,
                    id="django_rtq.W004",
                )
            )
    elsewhere = queues_named_elsewhere(conf)
    for queue in conf.QUEUES:
        if queue not in elsewhere:
            messages.append(
                checks.Warning(
                    f"Queue {queue!r} of RTQ['QUEUES'] is named by no task type, schedule or TASKS "
                    "backend, nor is it DEFAULT_QUEUE: is it a typo?",
                    hint="Tasks reach it only through .using(queue=...); if that is what you do, "
                    "silence this with SILENCED_SYSTEM_CHECKS = ['django_rtq.W005'].",
                    obj="settings.RTQ",
                    id="django_rtq.W005",
                )
            )
    for queue in conf.QUEUE_LIMITS:
        if queue not in conf.QUEUES and queue not in elsewhere:
            messages.append(
                checks.Warning(
                    f"RTQ['QUEUE_LIMITS'] limits queue {queue!r}, which the project names nowhere else "
                    "(not in RTQ['QUEUES'], nor the queue of a task type, schedule or TASKS backend): "
                    "is it a typo?",
                    hint=f"Known queues: {', '.join(sorted({*conf.QUEUES, *elsewhere}))}.",
                    obj="settings.RTQ",
                    id="django_rtq.W007",
                )
            )
    return messages


@checks.register(TAG)
def check_task_modules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W006: a task module could not be imported at start-up (django_rtq/discovery.py). A
    warning, not an error, so that `migrate` (which runs the checks) still works; rtq_worker
    refuses to start."""
    from .discovery import failed_modules

    return [
        checks.Warning(
            f"The task module {name!r} could not be imported, so its task types are unknown "
            f"(rtq_worker refuses to start):\n{error}",
            hint="Fix the error above; other commands (migrate, shell) work meanwhile.",
            obj=name,
            id="django_rtq.W006",
        )
        for name, error in failed_modules.items()
    ]


@checks.register(TAG)
def check_task_types_found(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W014: a registered task type that a worker might not find (django_rtq/discovery.py): of an
    app missing from INSTALLED_APPS, or named with `name=` outside the modules imported at start-up."""
    from .discovery import UNFOUND_HINT, startup_modules, why_unfound
    from .registry import registered_tasks

    found_at_startup = startup_modules()
    unfound = {name: why_unfound(name, t.func, found_at_startup) for name, t in registered_tasks().items()}
    return [
        checks.Warning(
            f"The task type {name!r} may never run: {why}.", hint=UNFOUND_HINT, obj=name, id="django_rtq.W014"
        )
        for name, why in unfound.items()
        if why
    ]


@checks.register(TAG)
def check_partition_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W015: a task type with partition limits but no way to name its tasks' partitions
    (`partition_by` or `partition`): only calls given `.using(partition=...)` are limited."""
    from .registry import registered_tasks

    return [
        checks.Warning(
            f"The task type {name!r} has partition limits, but its tasks get no partition unless "
            "a call gives one with .using(partition=...).",
            hint="Add partition_by='<argument>' (or a function of the arguments) to its @task "
            "(docs/partitions.md).",
            obj=name,
            id="django_rtq.W015",
        )
        for name, task_type in registered_tasks().items()
        if task_type.partition_limits is not None
        and task_type.options.get("partition_by") is None
        and task_type.options.get("partition") is None
    ]


@checks.register(TAG)
def check_tasks_api_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E005: settings.TASKS uses django-rtq's backend, but neither django.tasks nor the backport
    can be imported (Django 5.2 without the `tasks-backport` extra)."""
    aliases = list(rtq_task_backends())
    if not aliases or tasks_api_module() is not None:
        return []
    return [
        checks.Error(
            f"django_rtq.backends.RTQBackend (of {', '.join(map(repr, aliases))}) needs the django.tasks "
            "API: Django 6.0+ has it built in; on Django 5.2 install the backport: "
            'pip install "django-rtq[tasks-backport]"',
            obj="settings.TASKS",
            id="django_rtq.E005",
        )
    ]


# Tagged "database" alone: Django runs such checks only when asked for databases (`check
# --database default`, `migrate`); tagged "django_rtq" too, `check --tag django_rtq` would open
# a connection to every database on Django 6.
@checks.register(checks.Tags.database)
def check_tables(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W008 (with databases: `check --database default`): a table of django-rtq that the
    settings use is missing (the outbox's, the mirror's). Silent while `migrate` runs: it is
    about to create them."""
    if _migrating():
        return []
    return _missing_tables(databases or ())


# A deployment check may reach the services the project runs on (W003 reaches Redis): `check
# --deploy` says it too, so that a check before a deploy does not say "no issues" when the tables
# are missing. Plain `check` stays off the database, as Django's own checks do.
@checks.register(TAG, deploy=True)
def check_tables_deployed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W008 (deployment): as check_tables, in the databases the settings name."""
    conf = _settings()
    return _missing_tables(list(_tables_in_use(conf))) if conf is not None else []


def _tables_in_use(conf: RTQSettings) -> dict[str, list[str]]:
    """The tables of django-rtq the settings use, by database alias."""
    from .models import FinishedTask, OutboxTask

    tables: dict[str, list[str]] = {}
    if conf.OUTBOX or conf.OUTBOX_FALLBACK:
        tables.setdefault(conf.OUTBOX_DATABASE, []).append(OutboxTask._meta.db_table)
    if conf.MIRROR:
        tables.setdefault(conf.MIRROR_DATABASE, []).append(FinishedTask._meta.db_table)
    return tables


def _missing_tables(databases: Any) -> list[checks.CheckMessage]:
    conf = _settings()
    if conf is None:
        return []
    found = []
    for using, tables in _tables_in_use(conf).items():
        if using not in databases:
            continue
        connection = connections[using]
        try:
            with connection.cursor() as cursor:
                existing = set(connection.introspection.table_names(cursor))
        except DatabaseError:
            continue  # the database's own errors tell why
        missing = [table for table in tables if table not in existing]
        if missing:
            found.append(
                checks.Warning(
                    f"django-rtq's table(s) {', '.join(map(repr, missing))} are missing from the "
                    f"database {using!r}: enqueue_on_commit() fails, and workers can neither relay "
                    "the outbox nor mirror finished tasks, until they exist.",
                    hint=f"Run `manage.py migrate{'' if using == 'default' else f' --database {using}'}`, "
                    "or turn off what needs them: RTQ['OUTBOX'], RTQ['MIRROR'] (docs/reliability.md).",
                    obj="settings.RTQ",
                    id="django_rtq.W008",
                )
            )
    return found


def _migrating() -> bool:
    """Whether the checks run at the start of `migrate` (which is about to create the tables):
    Django runs its database checks then, and tells them nothing else than the database."""
    from django.core.management.commands.migrate import Command as Migrate

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False


def tasks_api_module() -> str | None:
    """The name of the module that provides the `django.tasks` API, None if none can be imported."""
    for name in TASKS_API_MODULES:
        try:
            import_module(name)
        except ImportError:
            continue
        return name
    return None


def _deploy_target() -> RedisTarget | None:
    """The Redis the deployment checks reach; None where the settings are wrong (other checks
    say why)."""
    conf = _settings()
    if conf is None:
        return None
    try:
        return redis_target(conf)
    except ImproperlyConfigured:
        return None  # E002 or E003 says why


@checks.register(TAG, REDIS_TAG, deploy=True)
def check_redis_reachable(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W003 (deployment only): Redis does not answer PING."""
    target = _deploy_target()
    if target is None:
        return []
    try:
        with _deploy_client(target) as client:
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
    return []


#: The check of each kind of finding of broker/redis_config.py.
REDIS_CONFIG_CHECKS = {
    EVICTS: (checks.Error, "django_rtq.E006"),
    NOT_PERSISTENT: (checks.Warning, "django_rtq.W010"),
    UNREADABLE: (checks.Warning, "django_rtq.W011"),
    TOO_OLD: (checks.Error, "django_rtq.E007"),
}


@checks.register(TAG, REDIS_TAG, deploy=True)
def check_redis_config(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E006 (deployment only): a master of Redis evicts keys when full, and
    RTQ['ALLOW_EVICTING_REDIS'] does not accept it; W010: a master keeps nothing over a restart;
    W011: its configuration cannot be read (CONFIG refused, INFO silent); E007: a master is older
    than Redis 7.0. One rule with the
    worker's: django_rtq/broker/redis_config.py."""
    configs = _read_deploy_redis(read_configs)
    if configs is None:
        return []
    conf = get_settings()
    messages = []
    for finding in findings(configs, eviction_allowed=conf.ALLOW_EVICTING_REDIS):
        kind, check_id = REDIS_CONFIG_CHECKS[finding.kind]
        messages.append(kind(finding.message, hint=finding.hint, obj="settings.RTQ", id=check_id))
    return messages


@checks.register(TAG, REDIS_TAG, deploy=True)
def check_other_projects(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W009 (deployment only): live workers of another Django project use the same Redis
    database and key prefix (django_rtq/projects.py); one warning per other project."""
    conf = get_settings()

    def live_workers(client: Any) -> Any:
        inspector = Inspector(Broker(client, prefix=conf.KEY_PREFIX))
        return inspector.worker_infos(inspector.live_worker_ids()).values()

    workers = _read_deploy_redis(live_workers)
    if workers is None:
        return []
    return [
        checks.Warning(
            sharing_problem(others, conf.KEY_PREFIX),
            hint=SHARING_HINT,
            obj="settings.RTQ",
            id="django_rtq.W009",
        )
        for others in other_projects(current_project(), workers).values()
    ]


def _read_deploy_redis(read: Callable[[Any], T]) -> T | None:
    """What `read` reads from the Redis of the settings, with a client of the check's own; None
    where the settings are wrong or Redis does not answer (E002, E003 or W003 says why)."""
    target = _deploy_target()
    if target is None:
        return None
    try:
        with _deploy_client(target) as client:
            return read(client)
    except Exception:
        return None


@contextmanager
def _deploy_client(target: RedisTarget) -> Iterator[Any]:
    """A client of its own for a deployment check, that gives up on an unreachable Redis soon."""
    timeouts = {"socket_connect_timeout": PING_TIMEOUT_SECONDS, "socket_timeout": PING_TIMEOUT_SECONDS}
    client = connect(target, **timeouts)  # a cluster client connects here already
    try:
        yield client
    finally:
        close_client(client)


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"

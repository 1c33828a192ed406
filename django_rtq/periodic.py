"""Periodic tasks: schedules declared in settings or on `@task`, their ticks, and their state."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from .broker import Broker
from .broker.message import TaskMessage
from .conf import RTQSettings, get_settings
from .connection import get_broker
from .exceptions import InvalidTask
from .registry import TaskType, find_task_type, periodic_task_types
from .task_options import SCHEDULE_OPTIONS, TASK_ID_PATTERN, TASK_ID_RULE, TYPE_OPTIONS, check_schedule

#: Keys of a schedule in `settings.RTQ["PERIODIC"]`, besides the task options below.
SCHEDULE_KEYS = frozenset({"task", "cron", "every", "args", "kwargs", "timezone"})
#: Task options a schedule in settings may set for the tasks it enqueues.
TASK_OPTIONS = TYPE_OPTIONS - SCHEDULE_OPTIONS - {"retry_backoff"}
#: A periodic task's id is this, its schedule's name, ":" and its tick in epoch milliseconds.
ID_PREFIX = "periodic:"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleEntry:
    """A declared schedule: which task to enqueue, with which arguments and options, and when."""

    name: str
    task_type: TaskType
    queue: str
    cron: str | None = None
    every: float | None = None  # seconds
    tz: tzinfo | None = None  # the time zone a cron expression is read in
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # task options of its tasks
    source: str = "settings"  # or "decorator"

    def latest_tick(self, now: float) -> int:
        """Return the latest tick at or before `now` (epoch seconds), in epoch milliseconds."""
        now_ms = int(now * 1000)
        if self.every is not None:
            step = _every_ms(self.every)
            return now_ms // step * step
        # croniter's get_prev() is strictly before its start: start just after now.
        start = datetime.fromtimestamp((now_ms + 1) / 1000, self.tz)
        return _ms(croniter(self.cron, start).get_prev(datetime))

    def next_tick(self, now: float) -> int:
        """Return the first tick after `now` (epoch seconds), in epoch milliseconds."""
        now_ms = int(now * 1000)
        if self.every is not None:
            step = _every_ms(self.every)
            return (now_ms // step + 1) * step
        start = datetime.fromtimestamp(now_ms / 1000, self.tz)
        return _ms(croniter(self.cron, start).get_next(datetime))

    def message(self, tick_ms: int) -> TaskMessage:
        """Build the message of this schedule's task for one tick."""
        task_type = self.task_type.using(**self.options, task_id=periodic_task_id(self.name, tick_ms))
        return task_type.prepare(*self.args, **self.kwargs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """What `get_schedules()` tells of a schedule: its declaration, next run and last tick."""

    name: str
    task: str
    queue: str
    cron: str | None
    every: float | None  # seconds
    timezone: str | None  # of a cron expression
    args: list[Any]
    kwargs: dict[str, Any]
    source: str  # "settings" or "decorator"
    next_run: datetime  # aware, UTC
    # The latest tick the workers dealt with: enqueued, or passed over (the schedule's first
    # tick seen, or its task still live). None if no worker has seen the schedule yet.
    last_tick: datetime | None


def periodic_task_id(name: str, tick_ms: int) -> str:
    """Return the id of a schedule's task for one tick."""
    return f"{ID_PREFIX}{name}:{tick_ms}"


def parse_periodic_id(task_id: str) -> tuple[str, int] | None:
    """Return (schedule name, tick in epoch ms) of a periodic task's id, or None for another id."""
    if not task_id.startswith(ID_PREFIX):
        return None
    name, _, tick = task_id[len(ID_PREFIX) :].rpartition(":")
    if not name or not tick.isdigit():
        return None
    return name, int(tick)


def load_entries(conf: RTQSettings | None = None) -> list[ScheduleEntry]:
    """Return every declared schedule, validated: those of `settings.RTQ["PERIODIC"]`, then
    those of `@task(cron=...)` and `@task(every=...)` task types (named after the task)."""
    conf = conf or get_settings()
    if not isinstance(conf.PERIODIC, dict):
        raise ImproperlyConfigured('settings.RTQ["PERIODIC"] must be a dict of schedule name -> dict.')
    entries = [_from_settings(name, spec) for name, spec in conf.PERIODIC.items()]
    for task_type in periodic_task_types():
        if task_type.name in conf.PERIODIC:
            raise ImproperlyConfigured(
                f"Periodic task {task_type.name!r} is declared twice: in settings.RTQ['PERIODIC'] "
                f"and on its @task. Give the one in settings another name."
            )
        cron, every = check_schedule(
            task_type.name, cron=task_type.options.get("cron"), every=task_type.options.get("every")
        )
        entries.append(_entry(task_type.name, task_type, cron=cron, every=every, source="decorator"))
    return entries


def get_schedules(broker: Broker | None = None) -> list[Schedule]:
    """Return every declared schedule with its next run and the last tick dealt with (from Redis)."""
    broker = broker or get_broker()
    entries = load_entries()
    now = broker.clock()
    ticks = {queue: broker.periodic_ticks(queue) for queue in {entry.queue for entry in entries}}
    schedules = []
    for entry in entries:
        last = ticks[entry.queue].get(entry.name)
        schedules.append(
            Schedule(
                name=entry.name,
                task=entry.task_type.name,
                queue=entry.queue,
                cron=entry.cron,
                every=entry.every,
                timezone=str(entry.tz) if entry.tz is not None else None,
                args=list(entry.args),
                kwargs=dict(entry.kwargs),
                source=entry.source,
                next_run=_utc(entry.next_tick(now)),
                last_tick=_utc(last) if last is not None else None,
            )
        )
    return schedules


def _from_settings(name: Any, spec: Any) -> ScheduleEntry:
    where = f"settings.RTQ['PERIODIC'][{name!r}]"
    if not isinstance(spec, dict):
        raise ImproperlyConfigured(f"{where} must be a dict, not {type(spec).__name__}.")
    unknown = sorted(set(spec) - SCHEDULE_KEYS - TASK_OPTIONS)
    if unknown:
        raise ImproperlyConfigured(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; expected some of: "
            f"{', '.join(sorted(SCHEDULE_KEYS | TASK_OPTIONS))}."
        )
    task_name = spec.get("task")
    if not isinstance(task_name, str) or not task_name:
        raise ImproperlyConfigured(f"{where} needs 'task': the name of a registered task.")
    task_type = find_task_type(task_name)
    if task_type is None:
        raise ImproperlyConfigured(
            f"{where} names an unknown task {task_name!r}: no @task is registered under that name "
            f"(task names are 'module.function', from the tasks modules of installed apps)."
        )
    cron, every = check_schedule(str(name), cron=spec.get("cron"), every=spec.get("every"))
    args, kwargs = spec.get("args", []), spec.get("kwargs", {})
    if not isinstance(args, list | tuple):
        raise ImproperlyConfigured(f"{where}: 'args' must be a list, not {type(args).__name__}.")
    if not isinstance(kwargs, dict):
        raise ImproperlyConfigured(f"{where}: 'kwargs' must be a dict, not {type(kwargs).__name__}.")
    zone = spec.get("timezone")
    if zone is not None and cron is None:
        raise ImproperlyConfigured(f"{where}: 'timezone' applies to a 'cron' schedule only.")
    return _entry(
        name,
        task_type,
        cron=cron,
        every=every,
        tz=_zone(zone, where) if zone is not None else None,
        args=list(args),
        kwargs=dict(kwargs),
        options={key: spec[key] for key in TASK_OPTIONS if key in spec},
        source="settings",
    )


def _entry(name: Any, task_type: TaskType, *, tz: tzinfo | None = None, **fields: Any) -> ScheduleEntry:
    """Build an entry, checking its name and that its task's message can be built."""
    if not isinstance(name, str) or not name or not TASK_ID_PATTERN.fullmatch(periodic_task_id(name, 0)):
        raise ImproperlyConfigured(
            f"Periodic task name {name!r} must be non-empty and fit in a task id, which is "
            f"{TASK_ID_RULE}: it becomes part of each tick's task id."
        )
    if fields.get("cron") is not None and tz is None:
        tz = timezone.get_default_timezone()
    entry = ScheduleEntry(name=name, task_type=task_type, queue="", tz=tz, **fields)
    try:
        sample = entry.message(0)
    except InvalidTask as exc:
        raise ImproperlyConfigured(f"Periodic task {name!r}: {exc}") from None
    return replace(entry, queue=sample.queue)


def _zone(name: Any, where: str) -> tzinfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ImproperlyConfigured(f"{where}: unknown time zone {name!r}.") from None


def _every_ms(every: float) -> int:
    return max(1, round(every * 1000))


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)

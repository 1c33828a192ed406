"""Building the message of a task call: its options resolved against the settings, its
arguments checked against the handler and against JSON."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
import time
from binascii import b2a_base64
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from .broker.message import MAX_PRIORITY, MIN_PRIORITY, TaskMessage
from .conf import RTQSettings, get_settings
from .connection import queue_time
from .exceptions import InvalidArguments, InvalidTask
from .queue_names import warn_if_unnamed
from .task_options import (
    TASK_ID_PATTERN,
    TASK_ID_RULE,
    as_instant,
    as_seconds,
    check_partition_name,
    check_queue,
    partition_weight,
)


class TaskSpec(Protocol):
    """What a message is built from: a task type's name, handler and options (a `TaskType`)."""

    @property
    def name(self) -> str: ...

    @property
    def func(self) -> Callable[..., Any]: ...

    @property
    def options(self) -> dict[str, Any]: ...


def build_message(
    task_type: TaskSpec, args: Sequence[Any], kwargs: dict[str, Any], *, tuples_become_lists: bool = False
) -> TaskMessage:
    """Resolve a call's options against the defaults and validate everything into a message.

    The arguments must fit the handler's signature and come back from JSON as they were given,
    tuples aside with `tuples_become_lists` (`django.tasks`' rule); else InvalidArguments."""
    plan = _call_plan(task_type)
    now = queue_time()
    warn_if_unnamed(plan.queue, task_type.name)
    opts = task_type.options
    deadline = process_at = None
    if not plan.plain:
        deadline = as_instant(opts.get("deadline"), "deadline", now)
        process_at = _process_at(opts, now)
    args, kwargs = list(args), dict(kwargs)
    _bind(task_type, args, kwargs)
    unique_key = unique_ttl = debounce = debounce_key = partition = task_id = None
    if plan.plain:  # no option of the call's own: the message is its arguments, an id and the time
        if not _plain_json(args, kwargs):
            _arguments_json(args, kwargs, task_type.name, tuples_become_lists=tuples_become_lists)
    else:
        arguments_json = _arguments_json(
            args, kwargs, task_type.name, tuples_become_lists=tuples_become_lists
        )
        unique = opts.get("unique", False)
        unique_key = opts.get("unique_key")
        if unique or unique_key:
            unique_ttl = (
                plan.conf.UNIQUE_TTL if unique is True or not unique else as_seconds(unique, "unique")
            )
            unique_key = call_key(task_type.name, unique_key, arguments_json, args, kwargs, "unique_key")
        debounce, debounce_key = _debounce(opts, task_type.name, arguments_json, args, kwargs)
        partition = _partition(task_type, args, kwargs)
        if debounce is not None:
            if unique_key is not None:
                raise InvalidTask(
                    f"Task {task_type.name!r}: give unique or debounce, not both (a debounced task is "
                    "one waiting copy per key already: docs/debounce.md)."
                )
            if process_at is not None:
                raise InvalidTask(
                    f"Task {task_type.name!r}: a debounced call is due `debounce` seconds after its "
                    "last enqueue; it takes no delay or process_at."
                )
            process_at = now + debounce
        task_id = opts.get("task_id")
        if task_id is not None and (not isinstance(task_id, str) or not TASK_ID_PATTERN.fullmatch(task_id)):
            raise InvalidTask(f"task_id must be {TASK_ID_RULE}, not {task_id!r}.")

    return TaskMessage(
        id=new_task_id() if task_id is None else task_id,
        task=task_type.name,
        queue=plan.queue,
        args=args,
        kwargs=kwargs,
        priority=plan.priority,
        max_retries=plan.max_retries,
        timeout=plan.timeout,
        deadline=deadline,
        retention=plan.retention,
        unique_key=unique_key,
        unique_ttl=unique_ttl,
        enqueued_at=now,
        process_at=process_at,
        debounce=debounce,
        debounce_key=debounce_key,
        partition=partition,
        partition_weight=partition_weight(opts, partition) if partition is not None else 1,
    )


def new_task_id() -> str:
    """A new task's id: 22 URL-safe characters, 128 random bits (a uuid4 has 122), short
    enough for Redis' 32-byte allocations (an id is stored three times: msg, state, the
    state's set), and never with a leading "-", which the management commands would take
    for an option."""
    while True:
        # secrets.token_urlsafe(16), in C calls only: this is on every enqueue's path.
        task_id = b2a_base64(os.urandom(16), newline=False).rstrip(b"=").translate(_URL_SAFE).decode()
        if task_id[0] != "-":
            return task_id


_URL_SAFE = bytes.maketrans(b"+/", b"-_")


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What a task type's options and the settings decide for every call of it, checked once
    per type (and again once either changes), so that a call resolves only its own."""

    conf: RTQSettings  # the settings it was resolved against
    options: dict[str, Any]  # the options it was resolved from (never changed in place)
    queue: str
    priority: int
    max_retries: int
    timeout: float | None
    retention: float
    # no option that depends on the call (a delay, a deadline, a unique or debounce key, a
    # partition, a task id): a message of its arguments, a new id and the time
    plain: bool


#: The options whose value depends on the call: a type that sets none makes plain messages.
_CALL_OPTIONS = (
    "deadline",
    "delay",
    "process_at",
    "unique",
    "unique_key",
    "debounce",
    "debounce_key",
    "partition",
    "partition_by",
    "task_id",
)


def _call_plan(task_type: TaskSpec) -> CallPlan:
    """The type's plan, kept on it (`TaskType.call_plan`) while its options and the settings
    are those it was made from; InvalidTask (each call) for an invalid option."""
    conf = get_settings()
    plan = getattr(task_type, "call_plan", None)
    if plan is not None and plan.conf is conf and plan.options is task_type.options:
        return plan
    plan = _resolve_plan(task_type, conf)
    with contextlib.suppress(AttributeError):  # a TaskSpec with no room for it: resolved each call
        object.__setattr__(task_type, "call_plan", plan)
    return plan


def _resolve_plan(task_type: TaskSpec, conf: RTQSettings) -> CallPlan:
    opts = task_type.options
    queue = opts.get("queue") or conf.DEFAULT_QUEUE
    check_queue(queue, task_type.name)
    priority = opts.get("priority", 0)
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise InvalidTask(
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, not {priority!r}."
        )
    max_retries = opts.get("max_retries", conf.MAX_RETRIES)
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        raise InvalidTask(f"max_retries must be a non-negative integer, not {max_retries!r}.")
    timeout = as_seconds(opts.get("timeout", conf.TIMEOUT), "timeout", allow_none=True)
    retention = as_seconds(opts.get("retention", conf.RETENTION), "retention")
    return CallPlan(
        conf=conf,
        options=opts,
        queue=queue,
        priority=priority,
        max_retries=max_retries,
        timeout=timeout,
        retention=retention or 0.0,
        plain=all(opts.get(name) is None or opts.get(name) is False for name in _CALL_OPTIONS),
    )


def call_key(
    task_name: str, given: Any, arguments_json: str, args: list[Any], kwargs: dict[str, Any], what: str
) -> str:
    """The key that tells two calls of a task type for the same (unique_key, debounce_key):
    `given` as a string, or what a callable given returns for the call's arguments, or by
    default the type's name and a digest of all its arguments."""
    if given is None:
        digest = hashlib.sha1(arguments_json.encode()).hexdigest()
        return f"{task_name}:{digest}"
    if callable(given):
        given = given(*args, **kwargs)
    if not isinstance(given, str) or not given:
        raise InvalidTask(f"{what} must be a non-empty string, not {given!r}.")
    return given


def _debounce(
    opts: dict[str, Any], task_name: str, arguments_json: str, args: list[Any], kwargs: dict[str, Any]
) -> tuple[float | None, str | None]:
    """A call's debounce window (seconds, at least a millisecond) and key; (None, None) if it
    is not debounced."""
    window = opts.get("debounce")
    if window is None or window is False:
        if opts.get("debounce_key") is not None:
            raise InvalidTask(f"Task {task_name!r}: debounce_key needs debounce (the window, in seconds).")
        return None, None
    seconds = as_seconds(window, "debounce")
    if seconds is None or seconds < 0.001:
        raise InvalidTask(f"debounce must be a window of a millisecond at least, not {window!r}.")
    return seconds, call_key(
        task_name, opts.get("debounce_key"), arguments_json, args, kwargs, "debounce_key"
    )


def _partition(task_type: TaskSpec, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """A call's partition (docs/partitions.md): the one given (`partition`), or else the value of
    the argument `partition_by` names, or what a callable `partition_by` returns for the call's
    arguments; None (no partition) for none, or an argument that is None."""
    opts = task_type.options
    value, by = opts.get("partition"), opts.get("partition_by")
    what = f"Task {task_type.name!r}: partition"
    if value is None and by is not None:
        if callable(by):
            value, what = by(*args, **kwargs), f"Task {task_type.name!r}: what partition_by returned"
        else:
            value, what = _argument(task_type, by, args, kwargs), f"Task {task_type.name!r}: argument {by!r}"
    if value is None:
        return None
    return check_partition_name(value, what)


def _argument(task_type: TaskSpec, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The value the call gives the handler's parameter `name` (its default if not given)."""
    if name in kwargs:
        return kwargs[name]
    signature = _signature(task_type.func)
    if signature is None:
        return None
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments.get(name)


def check_arguments(task_type: TaskSpec, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Raise InvalidArguments unless the handler can take these arguments and they come back
    from JSON as given: the rule of an enqueue, for arguments edited by hand."""
    _bind(task_type, args, kwargs)
    _arguments_json(args, kwargs, task_type.name)


@lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):  # a callable whose signature Python cannot tell
        return None


def binding_problem(task_type: TaskSpec, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """Why a worker's handler could not take a message's arguments (bound by the enqueuer's
    release, whose signature may differ), or None if it can. Whether they bind depends only on
    how many arguments there are and the keywords' names: answered once per shape."""
    return _binding_problem(task_type.func, len(args), tuple(sorted(kwargs)) if kwargs else ())


@lru_cache(maxsize=4096)
def _binding_problem(func: Callable[..., Any], positional: int, keywords: tuple[str, ...]) -> str | None:
    signature = _signature(func)
    if signature is None:
        return None
    try:
        signature.bind(*range(positional), **dict.fromkeys(keywords))
    except TypeError as exc:
        return f"{exc} (it takes {signature})"
    return None


@lru_cache(maxsize=1024)
def signature_fingerprint(func: Callable[..., Any]) -> str:
    """A short digest of a handler's signature: the same in every process of a release, another
    when a parameter changes. It names the releases that refused a task's arguments."""
    return hashlib.sha1(str(_signature(func)).encode(), usedforsecurity=False).hexdigest()[:8]


#: Seconds between two announcements of one task type's signature by a process.
ANNOUNCE_EVERY_SECONDS = 3600.0
# (task name, signature fingerprint) -> when (monotonic) this process last announced it
_announced: dict[tuple[str, str], float] = {}
# what this process bound calls to and has not announced since ANNOUNCE_EVERY_SECONDS
_unannounced: set[tuple[str, str]] = set()


def note_signature(task_type: TaskSpec) -> None:
    """Note that this process binds calls of a task type to its handler's signature: workers
    of another release, whose signature differs, then know to wait for one that has it."""
    seen = (task_type.name, signature_fingerprint(task_type.func))
    last = _announced.get(seen)
    if last is None or time.monotonic() - last > ANNOUNCE_EVERY_SECONDS:
        _unannounced.add(seen)


def take_unannounced() -> list[tuple[str, str]]:
    """The signatures noted and not announced of late, taken as announced now."""
    if not _unannounced:
        return []
    taken = list(_unannounced)
    _unannounced.clear()
    now = time.monotonic()
    _announced.update(dict.fromkeys(taken, now))
    return taken


def forget_announcements() -> None:
    """Have this process announce every signature again with its next enqueue (as after a
    restart: when it talks to another Redis or key prefix, say)."""
    _announced.clear()


def give_back_unannounced(signatures: list[tuple[str, str]]) -> None:
    """Signatures whose announcement failed: announce them with the next enqueue."""
    for seen in signatures:
        _announced.pop(seen, None)
        _unannounced.add(seen)


def _bind(task_type: TaskSpec, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Raise InvalidArguments (a TypeError) in the caller if the handler could not take these
    arguments, rather than have the worker fail the task with the same TypeError."""
    note_signature(task_type)
    problem = binding_problem(task_type, args, kwargs)  # answered once per shape of call
    if problem is not None:
        raise InvalidArguments(f"Task {task_type.name!r} cannot be called with these arguments: {problem}.")


#: The canonical form of a call's arguments (sorted keys, no spaces) that unique keys hash.
_ARGUMENTS_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def _arguments_json(
    args: list[Any], kwargs: dict[str, Any], task_name: str, *, tuples_become_lists: bool = False
) -> str:
    """Encode the arguments canonically (the unique key hashes this), or say which one is not
    JSON or would not come back from JSON as given. `tuples_become_lists` allows tuples, as
    `django.tasks` does (its own backends hand the handler lists too)."""
    try:
        encoded = _ARGUMENTS_ENCODER.encode([args, kwargs])
    except (TypeError, ValueError):
        pass
    else:
        changed = None
        if any(type(value) not in _SCALARS for value in args) or any(
            type(value) not in _SCALARS for value in kwargs.values()
        ):
            changed = _changed_by_json([args, kwargs], tuples_become_lists)
        if changed is None:
            return encoded
        where, why = changed
        raise InvalidArguments(
            f"The {_describe_argument(where)} of task {task_name!r} would reach the handler changed: {why}."
        )
    for what, value in [
        *((f"argument {i}", arg) for i, arg in enumerate(args)),
        *((f"argument {name!r}", arg) for name, arg in kwargs.items()),
    ]:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArguments(
                f"The {what} of task {task_name!r} must be JSON-serializable: {exc}."
            ) from None
    raise InvalidArguments(f"The arguments of task {task_name!r} must be JSON-serializable.")


#: Types whose values come back from JSON as they were; one of their subclasses (an IntEnum)
#: comes back as the type it derives from.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain_json(args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether the arguments are all values JSON holds as they are (strings, numbers, booleans,
    None; no NaN or infinity): then they need no encoding to be checked."""
    for value in (*args, *kwargs.values()):
        kind = type(value)
        if kind not in _SCALARS or (kind is float and not math.isfinite(value)):
            return False
    return True


def _changed_by_json(
    value: Any, tuples_become_lists: bool, path: tuple[Any, ...] = ()
) -> tuple[tuple[Any, ...], str] | None:
    """Where (a path into [args, kwargs]) and how JSON-encodable data would not decode as it
    was; None if it would."""
    if isinstance(value, tuple) and not tuples_become_lists:
        return path, "a tuple decodes as a list (pass a list)"
    if isinstance(value, list | tuple):
        items: Iterable[tuple[Any, Any]] = enumerate(value)
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                return (*path, key), f"the key {key!r} decodes as the string {json.dumps(key)!r}"
        items = value.items()
    elif type(value) not in _SCALARS:
        base = next(t for t in (bool, int, float, str) if isinstance(value, t))
        return path, f"a {type(value).__name__} decodes as a plain {base.__name__}"
    else:
        return None
    for where, item in items:
        if type(item) not in _SCALARS:
            changed = _changed_by_json(item, tuples_become_lists, (*path, where))
            if changed:
                return changed
    return None


def _describe_argument(path: tuple[Any, ...]) -> str:
    """Name a place in [args, kwargs]: "argument 0", "argument 'items' [2]['a']"."""
    if len(path) < 2:
        return "arguments"
    name = f"argument {path[1]}" if path[0] == 0 else f"argument {path[1]!r}"
    return name + "".join(f"[{step!r}]" for step in path[2:])


def _process_at(opts: dict[str, Any], now: float) -> float | None:
    delay, process_at = opts.get("delay"), opts.get("process_at")
    if delay is not None and process_at is not None:
        raise InvalidTask("Give delay or process_at, not both.")
    if delay is not None:
        return now + as_seconds(delay, "delay")
    return as_instant(process_at, "process_at", now)

"""The message of a task: what to run and how, as stored (JSON) in the queue's msg hash."""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .versions import MESSAGE_FORMAT, NewerFormat, stored_version

#: Highest and lowest priority; higher runs first (the range of `django.tasks`).
MIN_PRIORITY = -100
MAX_PRIORITY = 100
#: The longest task id, in characters (printable ASCII: as many bytes); see TASK_ID_PATTERN.
MAX_ID_LENGTH = 255
#: The longest partition name, in characters (docs/partitions.md).
MAX_PARTITION_LENGTH = 200
#: The highest weight of a partition: the turns it takes in a round of the others' one.
MAX_PARTITION_WEIGHT = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskMessage:
    """A task as enqueued. Immutable: attempt facts live in the task's info."""

    id: str
    task: str  # registered task type name
    queue: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    max_retries: int = 0
    timeout: float | None = None  # seconds per attempt
    deadline: float | None = None  # epoch seconds by which it must have finished
    retention: float = 0.0  # seconds a completed task is kept
    unique_key: str | None = None  # uniqueness lock held while the task is live
    unique_ttl: float | None = None  # seconds the uniqueness lock lasts at most
    enqueued_at: float = 0.0  # epoch seconds
    process_at: float | None = None  # epoch seconds; None = at once
    parent: str | None = None  # id of the workflow this task is a step or child of
    parent_queue: str | None = None  # the workflow's queue
    position: int | str | None = None  # the child's place in its workflow
    # the trace context of its enqueue (W3C traceparent/tracestate...: tracing.py); format 2
    trace: dict[str, str] | None = None
    # debounce (docs/debounce.md): the window (seconds) that a later enqueue of the same
    # debounce key restarts, that key, and how many enqueues the script merged into this one
    # (written by enqueue.lua, never by the caller); format 3
    debounce: float | None = None
    debounce_key: str | None = None
    merged_enqueues: int = 0
    # fair partitions (docs/partitions.md): the partition whose turn the task waits for, and that
    # partition's weight (turns per round); written right after "v", where the scripts read
    # them with an anchored pattern; format 4
    partition: str | None = None
    partition_weight: int = 1

    def to_json(self) -> str:
        """The message as stored: its fields in declaration order, leaving out the id and the
        queue (its reader knows them: the msg hash's field, the key's hash tag) and those that
        hold their default (from_json puts them back), but enqueued_at (see _ALWAYS_STORED).
        Its format version "v" comes second, right after the task (the claim script reads it
        with an anchored pattern), and only above version 1; a partition and its weight come
        right after it (_lib.lua's partition_of reads them so) (never written: see versions.py):
        a message is written in the oldest format that holds its fields (`version`)."""
        stored = {
            name: value
            for name, unless, value in zip(_OPTIONAL_NAMES, _LEFT_OUT_AT, _optional_values(self), strict=True)
            if value != unless
        }
        data: dict[str, Any] = {"task": self.task}
        version = _version_holding(stored.keys() & FIELD_SINCE.keys())
        if version > 1:
            data["v"] = version
        if self.partition is not None:
            data["partition"] = stored.pop("partition")
            if "partition_weight" in stored:
                data["partition_weight"] = stored.pop("partition_weight")
        data.update(stored)
        return _ENCODER.encode(data)

    def version(self) -> int:
        """The oldest format version that holds this message: a field of a later format, away
        from its default, raises it (a worker of an older release leaves the task, rather than
        archive it for a field it does not know)."""
        return _version_holding(name for name in FIELD_SINCE if getattr(self, name) != _DEFAULTS[name])

    @classmethod
    def from_json(cls, raw: str | bytes, *, id: str, queue: str) -> TaskMessage:
        """Parse a stored message of the task `id` of `queue`, compact (as to_json writes it) or
        with every field, the id and queue among them (as earlier versions did: the id and queue
        given win over those); raise ValueError if it is not one, or a field is of a wrong type
        or out of its range. A field left out holds its default. Raise NewerFormat (a
        ValueError) for a message of a format version newer than MESSAGE_FORMAT, before any
        other check: it may hold fields this release does not know."""
        if isinstance(raw, str) and not raw.isascii() and not is_utf8(raw):
            raise ValueError("task message is not UTF-8")
        data = _parsed(raw)
        if not isinstance(data, dict):
            raise ValueError("task message is not a JSON object")
        version = stored_version(data.pop("v", None))
        if version > MESSAGE_FORMAT:
            raise NewerFormat("message", version, MESSAGE_FORMAT)
        if version < _LATEST_FIELD_SINCE and not _LATER_FIELDS.isdisjoint(data):
            later = [  # (a field at its default is none: a message stored in full has them all)
                name
                for name, since in FIELD_SINCE.items()
                if since > version and data.get(name, _DEFAULTS[name]) not in (None, _DEFAULTS[name])
            ]
            if later:
                raise ValueError(f"task message of format {version} has fields of a later one: {later}")
        data.pop("id", None)
        data.pop("queue", None)
        try:
            message = _built(id, queue, data) if cls is TaskMessage else cls(id=id, queue=queue, **data)
        except TypeError as exc:
            raise ValueError(f"task message has unexpected fields: {exc}") from None
        for name, value in data.items():  # JSON gives exact types: a bool is not an int here
            expected, allowed = _FIELD_CHECKS[name]
            if type(value) not in expected:
                raise ValueError(
                    f"task message field {name!r} is {value!r}, not of type {_type_names(expected)}"
                )
            if allowed is not None and value is not None and not allowed(value):
                raise ValueError(f"task message field {name!r} is {value!r}, out of its range")
        return message


#: The fields that have a default (all but id, task and queue), in order, each with its default.
_OPTIONAL_FIELDS: tuple[tuple[str, Any], ...] = tuple(
    (f.name, f.default_factory() if f.default is MISSING else f.default)
    for f in fields(TaskMessage)
    if f.default is not MISSING or f.default_factory is not MISSING
)
_DEFAULTS = dict(_OPTIONAL_FIELDS)
#: The fields added after format version 1, each with the version that added it (MESSAGE_FORMAT
#: at most): a message that holds one is written in that version (TaskMessage.version).
FIELD_SINCE: dict[str, int] = {
    "trace": 2,
    "debounce": 3,
    "debounce_key": 3,
    "merged_enqueues": 3,
    "partition": 4,
    "partition_weight": 4,
}
#: Stored even at its default: the ORM mirror reads the stored JSON itself, and takes a missing
#: enqueued_at for an unknown time but 0.0 for the epoch.
_ALWAYS_STORED = frozenset({"enqueued_at"})
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
#: The optional fields' names and their values, read at once (to_json), and the value each is
#: left out at: its default, or a value no field equals for those stored whatever they hold.
_OPTIONAL_NAMES = tuple(name for name, _ in _OPTIONAL_FIELDS)
_optional_values = operator.attrgetter(*_OPTIONAL_NAMES)
_ALWAYS = object()
_LEFT_OUT_AT = tuple(_ALWAYS if name in _ALWAYS_STORED else default for name, default in _OPTIONAL_FIELDS)
_NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))
OPTIONAL_STR = (str, type(None))
#: The type(s) each message field must have; a message read from Redis is checked against it.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "task": (str,),
    "queue": (str,),
    "args": (list,),
    "kwargs": (dict,),
    "priority": (int,),
    "max_retries": (int,),
    "timeout": OPTIONAL_NUMBER,
    "deadline": OPTIONAL_NUMBER,
    "retention": _NUMBER,
    "unique_key": OPTIONAL_STR,
    "unique_ttl": OPTIONAL_NUMBER,
    "enqueued_at": _NUMBER,
    "process_at": OPTIONAL_NUMBER,
    "parent": OPTIONAL_STR,
    "parent_queue": OPTIONAL_STR,
    "position": (int, str, type(None)),
    "trace": (dict, type(None)),
    "debounce": OPTIONAL_NUMBER,
    "debounce_key": OPTIONAL_STR,
    "merged_enqueues": (int,),
    "partition": OPTIONAL_STR,
    "partition_weight": (int,),
}


#: What the numbers of a message may be (a message read from Redis is checked against it).
_FIELD_RANGES = {
    "priority": lambda value: MIN_PRIORITY <= value <= MAX_PRIORITY,
    "max_retries": lambda value: value >= 0,
    "timeout": lambda value: value >= 0,
    "retention": lambda value: value >= 0,
    "unique_ttl": lambda value: value >= 0,
    "debounce": lambda value: value > 0,
    "merged_enqueues": lambda value: value >= 0,
    "partition": lambda value: is_partition_name(value),
    "partition_weight": lambda value: 1 <= value <= MAX_PARTITION_WEIGHT,
    "trace": lambda value: all(type(k) is str and type(v) is str for k, v in value.items()),
}


def _version_holding(later_fields: Iterable[str]) -> int:
    """The oldest format version that holds these fields of later formats (1 for none)."""
    return max((FIELD_SINCE[name] for name in later_fields), default=1)


#: Each field's types and range check (None: any value of its types), as from_json applies them.
_FIELD_CHECKS = {name: (types, _FIELD_RANGES.get(name)) for name, types in _FIELD_TYPES.items()}
#: The fields of later formats, and the latest format that added one: a message of that format,
#: or holding none of them, has none of a format later than its own (from_json).
_LATER_FIELDS = frozenset(FIELD_SINCE)
_LATEST_FIELD_SINCE = max(FIELD_SINCE.values())


#: Each field's slot setter, and its default or (for a mutable one) its default's factory.
_SLOTS = tuple(
    (getattr(TaskMessage, f.name).__set__, f.name, f.default, f.default_factory)
    for f in fields(TaskMessage)
    if f.name not in ("id", "queue")
)
_STORED_NAMES = frozenset(name for _, name, _, _ in _SLOTS)


def _built(id: str, queue: str, data: dict[str, Any]) -> TaskMessage:
    """TaskMessage(id=id, queue=queue, **data), raising the TypeError that call would, at half
    its cost: a frozen dataclass's __init__ sets each of its fields through object.__setattr__,
    and a worker reads a message for every task it takes."""
    if "task" not in data or not _STORED_NAMES.issuperset(data):
        return TaskMessage(id=id, queue=queue, **data)  # raises the TypeError naming what is wrong
    message = _new(TaskMessage)
    get = data.get
    for set_slot, name, default, factory in _SLOTS:
        if factory is MISSING:
            set_slot(message, get(name, default))
        else:
            set_slot(message, data[name] if name in data else factory())
    _ID_SLOT(message, id)
    _QUEUE_SLOT(message, queue)
    return message


_new = object.__new__
_ID_SLOT = TaskMessage.id.__set__  # type: ignore[attr-defined]
_QUEUE_SLOT = TaskMessage.queue.__set__  # type: ignore[attr-defined]


def _parsed(raw: str | bytes) -> Any:
    """json.loads(raw), at half its cost for a message as stored (json.loads looks for a BOM and
    whitespace around the JSON first): anything else is left to json.loads, to parse or to raise."""
    if isinstance(raw, str):
        try:
            data, end = _DECODER.raw_decode(raw)
        except ValueError:
            end = -1
        if end == len(raw):
            return data
    return json.loads(raw)


_DECODER = json.JSONDecoder()


def is_partition_name(value: str) -> bool:
    """Whether `value` may name a partition: 1 to MAX_PARTITION_LENGTH characters, none of them a
    control character (the scripts join scopes with \\0, \\1, \\2 and newlines)."""
    return 0 < len(value) <= MAX_PARTITION_LENGTH and not any(ord(c) < 32 or ord(c) == 127 for c in value)


def is_utf8(text: str) -> bool:
    """Whether a str read from Redis was valid UTF-8 (bad bytes read as escaped surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def child_notice(message: TaskMessage) -> str:
    """For a workflow's child, the command that tells its workflow it succeeded, cut before its
    result: the finishing script appends the result JSON and the closing brace. "" otherwise."""
    if not message.parent:
        return ""
    head = _ENCODER.encode(
        {
            "type": "child",
            "to": message.parent,
            "to_queue": message.parent_queue,
            "pos": message.position,
            "child": message.id,
            "ok": True,
        }
    )
    return head[:-1] + ',"result":'


#: A message's options: its fields besides what names the call (id, task, queue, arguments).
OPTION_FIELDS = tuple(
    f.name for f in fields(TaskMessage) if f.name not in ("id", "task", "queue", "args", "kwargs")
)

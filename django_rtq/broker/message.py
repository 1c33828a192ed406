"""The message of a task: what to run and how, as stored (JSON) in the queue's msg hash."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

#: Highest and lowest priority; higher runs first (the range of `django.tasks`).
MIN_PRIORITY = -100
MAX_PRIORITY = 100


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

    def to_json(self) -> str:
        return _ENCODER.encode({name: getattr(self, name) for name in _FIELD_NAMES})

    @classmethod
    def from_json(cls, raw: str | bytes) -> TaskMessage:
        """Parse a stored message; raise ValueError if it is not one."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("task message is not a JSON object")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"task message has unexpected fields: {exc}") from None


_FIELD_NAMES = tuple(f.name for f in fields(TaskMessage))
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


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

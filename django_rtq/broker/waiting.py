"""Tasks left waiting for a worker that can run them ("parked"): their kinds, and reading them.

A worker that claims a task its release cannot run (an unknown type, a stored format newer than
it reads, arguments that do not bind to its handler) neither runs nor archives it: park.lua
leaves it in pending, its score raised by PARKED_BASE, indexed in the queue's `parked` set by
kind. A claim of a worker that can run a kind takes its tasks from there (claim.lua); the janitor
archives a kind no worker took for RTQ["NO_WORKER_GRACE"] seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .claims import KIND_SEPARATOR
from .errors import translate_errors

if TYPE_CHECKING:
    from .broker import Broker

#: Why a worker left a task: its type is unknown to it, its stored format is newer than it reads,
#: or its arguments do not bind to its handler's signature.
UNKNOWN_TYPE = "type"
NEWER_FORMAT = "format"
UNBOUND_ARGUMENTS = "args"
#: Parked kinds a reader looks at, at most (each is one round trip of a ZLEXCOUNT).
KINDS_SCAN = 100


def kind_of(task: str, why: str, refused_by: tuple[str, ...] = ()) -> str:
    """The kind of a parked task: its type and why, and for arguments, the fingerprints of the
    handler signatures that refused them (so that none of those takes it again)."""
    parts = [task, why, *refused_by]
    kind = KIND_SEPARATOR.join(parts)
    return kind + KIND_SEPARATOR if refused_by else kind


def parse_kind(kind: str) -> tuple[str, str, tuple[str, ...]]:
    """The task type, why, and refusing fingerprints of a kind (see kind_of)."""
    task, _, rest = kind.partition(KIND_SEPARATOR)
    why, _, refused = rest.partition(KIND_SEPARATOR)
    return task, why, tuple(part for part in refused.split(KIND_SEPARATOR) if part)


def kind_range(kind: str) -> tuple[str, str]:
    """The ZRANGEBYLEX bounds of a kind's entries in the parked index."""
    return f"[{kind}\0", f"({kind}\1"


@dataclass(frozen=True, slots=True)
class WaitingKind:
    """Tasks of one type that wait for a worker able to run them, and why."""

    task: str
    why: str  # UNKNOWN_TYPE, NEWER_FORMAT or UNBOUND_ARGUMENTS
    count: int
    since: float | None  # epoch seconds since which no worker took them
    reason: str


def parked_kinds(broker: Broker, queue: str) -> dict[str, dict[str, Any]]:
    """The kinds of a queue's parked tasks, each with its facts ("since" (ms), "reason")."""
    with translate_errors():
        kinds = broker.client.hgetall(broker.queue(queue).parked_kinds)
    return {kind: _facts(raw) for kind, raw in kinds.items()}


def parked_ids(broker: Broker, queue: str, kind: str, limit: int) -> list[str]:
    """The ids of up to `limit` parked tasks of a kind, in their order (some may be stale)."""
    with translate_errors():
        entries = broker.client.zrangebylex(broker.queue(queue).parked, *kind_range(kind), start=0, num=limit)
    return [task_id for entry in entries if (task_id := entry[len(kind) + 1 :].partition("\0")[2])]


def waiting_for_worker(broker: Broker, queue: str) -> list[WaitingKind]:
    """The kinds of tasks of a queue waiting for a worker that can run them, by task name."""
    qk = broker.queue(queue)
    kinds = parked_kinds(broker, queue)
    if not kinds:
        return []
    names = sorted(kinds)[:KINDS_SCAN]
    with translate_errors():
        pipe = broker.client.pipeline(transaction=False)
        for kind in names:
            pipe.zlexcount(qk.parked, *kind_range(kind))
        counts = pipe.execute()
    waiting = []
    for kind, count in zip(names, counts, strict=True):
        if not count:
            continue
        task, why, _ = parse_kind(kind)
        facts = kinds[kind]
        since = facts.get("since")
        waiting.append(
            WaitingKind(
                task=task,
                why=why,
                count=count,
                since=since / 1000 if isinstance(since, int | float) else None,
                reason=str(facts.get("reason", "")),
            )
        )
    return waiting


def _facts(raw: str) -> dict[str, Any]:
    try:
        facts = json.loads(raw)
    except ValueError:
        return {}
    return facts if isinstance(facts, dict) else {}

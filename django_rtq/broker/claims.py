"""What a worker tells a claim (Abilities), what a claim hands it (ClaimedTask, Claimed), and what
the worker settles (Completion)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .limits import NO_LIMITS, FlowLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedTask:
    """A task a worker has just claimed: its raw message (parsed later) and attempt facts."""

    id: str
    queue: str
    raw_message: str | None  # None when the task's message is missing (a corrupt task)
    info: dict[str, Any] = field(default_factory=dict)
    run: str = ""  # the claim's number: the fencing token its results are settled with
    #: taken from the parked tasks whose arguments did not bind: the fingerprints of the handler
    #: signatures that refused them, "\1"-separated (broker/waiting.py)
    refused_by: str = ""
    #: the checkpoint facts this run saved (broker/checkpoint.py): its info settles with them
    checkpoint: dict[str, Any] = field(default_factory=dict)


class Claimed(list[ClaimedTask]):
    """The tasks one claim took, and what the queue's flow-control limits said (claim.lua)."""

    #: Seconds until the worker should claim again, as a rate limit then lets a waiting task start
    #: (0: at once); None when no task waits for a rate limit.
    wait: float | None = None
    #: Tasks the limits let start wait only for a free thread: claim again when one frees.
    thread_bound: bool = False
    #: The limits the claim applied (a task of a type they did not know may have passed its own).
    limits: FlowLimits = NO_LIMITS
    #: Parked kinds the worker has not judged yet: it judges them and claims again at once.
    unjudged_kinds: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """A successful attempt to settle."""

    id: str
    run: str
    info: dict[str, Any]
    result_json: str
    retention_ms: int
    unique_key: str | None = None
    # (started, finished) epoch seconds of a first attempt whose info is empty: the script
    # writes the info of such an attempt itself
    times: tuple[float, float] | None = None
    # a workflow's child: the command to its workflow, up to the result (see child_notice)
    notify: str = ""


#: Separates the parts of a parked task's kind: "<task>\1<why>", and for arguments, each
#: fingerprint after it (broker/waiting.py); and a task's name from a signature's fingerprint.
KIND_SEPARATOR = "\1"

#: Added to a parked task's pending score: after every task that can run, and after the held
#: ones (limits.HELD_BASE; held scores stay below 6.1e15), still an exact integer in a double.
#: The same as PARKED_BASE in _lib.lua (a test checks).
PARKED_BASE = 6_500_000_000_000_000


@dataclass(frozen=True, slots=True)
class Abilities:
    """What a worker tells each claim of what its release cannot run, each "\n"-joined: the
    task types it does not know (their tasks are parked as the claim passes them), and the
    parked kinds it has judged it can run (taken first) or cannot."""

    unknown_types: str = ""
    can_run: str = ""
    cannot_run: str = ""


NO_ABILITIES = Abilities()


def read_claim_notes(notes: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """A claim's notes (claim.lua): the parked kinds the worker has not judged yet, and for each
    task taken from a kind of arguments that did not bind, the fingerprints that refused them."""
    try:
        data = json.loads(notes)
    except ValueError:
        return (), {}
    kinds = data.get("kinds") if isinstance(data, dict) else None
    refused_by = data.get("refused_by") if isinstance(data, dict) else None
    return (
        tuple(kind for kind in kinds if isinstance(kind, str)) if isinstance(kinds, list) else (),
        {k: v for k, v in refused_by.items() if isinstance(v, str)} if isinstance(refused_by, dict) else {},
    )

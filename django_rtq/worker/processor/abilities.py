"""What this worker's release can run: the tasks it leaves for another worker, and its verdict
on each kind of task others left (broker/waiting.py)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from ...broker import Broker, ClaimedTask, TaskMessage
from ...broker.attempt import check_info_version
from ...broker.claims import NO_ABILITIES, Abilities
from ...broker.versions import INFO_FORMAT, MESSAGE_FORMAT, NewerFormat
from ...broker.waiting import (
    NEWER_FORMAT,
    UNBOUND_ARGUMENTS,
    UNKNOWN_TYPE,
    kind_of,
    parse_kind,
)
from ...conf import get_settings
from ...exceptions import NonRetryableError
from ...message_builder import binding_problem, signature_fingerprint
from ...registry import TaskType, find_task_type
from .jobs import Unrunnable

logger = logging.getLogger(__name__)

#: The newest version of each stored format this release reads, by the name NewerFormat gives.
READABLE = {"message": MESSAGE_FORMAT, "info": INFO_FORMAT}
#: Seconds between two log lines about tasks of one kind left for another worker.
LOG_EVERY_SECONDS = 60.0
#: Seconds a worker relies on the signatures of a task type it read.
SIGNATURES_TTL = 5.0


class LeftForAnother(Exception):
    """A claimed task this worker's release cannot run, and another's may: it is parked."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def message_or_leave(claimed: ClaimedTask) -> TaskMessage:
    """The claimed task's message; raise LeftForAnother if it or its info is of a newer format
    (ValueError if the message is corrupt)."""
    assert claimed.raw_message is not None
    try:
        message = TaskMessage.from_json(claimed.raw_message, id=claimed.id, queue=claimed.queue)
        if claimed.info:  # a first attempt has none
            check_info_version(claimed.info)
    except NewerFormat as exc:
        raise LeftForAnother(_format_kind(claimed.raw_message, exc), str(exc)) from None
    return message


def task_type_or_leave(
    message: TaskMessage, claimed: ClaimedTask, signatures_of: Callable[[str, bool], set[str]]
) -> TaskType:
    """The task type that runs the message; raise LeftForAnother if this release does not know
    it, or its handler would not take the message's arguments (bound by the enqueuer's release)
    while another release's might; Unrunnable if no release that enqueues or runs the type of
    late (`signatures_of(task, fresh)` tells their signatures: read again before archiving) has
    a handler they fit."""
    task_type = find_task_type(message.task)
    if task_type is None:
        raise LeftForAnother(kind_of(message.task, UNKNOWN_TYPE), f"unknown task type {message.task!r}")
    problem = binding_problem(task_type, message.args, message.kwargs)
    if problem is not None:
        refused = tuple(
            dict.fromkeys((*_fingerprints(claimed.refused_by), signature_fingerprint(task_type.func)))
        )
        reason = f"its arguments do not fit {task_type.name}: {problem}"
        others_may_fit = not signatures_of(message.task, False) <= set(refused)
        if not others_may_fit and signatures_of(message.task, True) <= set(refused):
            raise Unrunnable(message) from NonRetryableError(
                f"{reason}; nor do they fit any other release that enqueues or runs it"
            )
        raise LeftForAnother(kind_of(message.task, UNBOUND_ARGUMENTS, refused), reason)
    return task_type


class ReleaseAbilities:
    """What this worker tells its claims (`current`): the types it found it does not know, and
    its verdict on each parked kind a claim showed it. Shared by the fetching threads."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.current: Abilities = NO_ABILITIES
        self._signatures: dict[str, tuple[float, set[str]]] = {}
        self._unknown_types: set[str] = set()
        self._verdicts: dict[str, bool] = {}
        self._logged_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def signatures_of(self, task: str, fresh: bool = False) -> set[str]:
        """The handler signatures of a task type that processes enqueueing or running it have
        announced within the grace (read again when `fresh`, or after SIGNATURES_TTL seconds)."""
        now = time.monotonic()
        cached = self._signatures.get(task)
        if fresh or cached is None or now - cached[0] > SIGNATURES_TTL:
            grace_ms = int(get_settings().NO_WORKER_GRACE * 1000)
            cached = (now, self.broker.signatures_of(task, seen_since_ms=self.broker.now_ms() - grace_ms))
            self._signatures[task] = cached
        return cached[1]

    def judge(self, kinds: tuple[str, ...]) -> None:
        """Decide, for kinds parked by others, whether this release can run their tasks."""
        with self._lock:
            for kind in kinds:
                self._verdicts[kind] = can_run(kind)
            self._publish()

    def note_left(self, queue: str, kind: str, reason: str, count: int) -> None:
        """Remember a kind this release cannot run (so that claims pass over it), and say so in
        the log, once a minute per kind at most."""
        task, why, _ = parse_kind(kind)
        with self._lock:
            self._verdicts[kind] = False
            if why == UNKNOWN_TYPE:
                self._unknown_types.add(task)
            self._publish()
            now = time.monotonic()
            if now - self._logged_at.get(kind, -LOG_EVERY_SECONDS) < LOG_EVERY_SECONDS:
                return
            self._logged_at[kind] = now
        logger.warning(
            "leaving %d task(s) of type %r in queue %r for a worker that can run them: %s",
            count,
            task,
            queue,
            reason,
        )

    def _publish(self) -> None:
        self.current = Abilities(
            unknown_types="\n".join(sorted(self._unknown_types)),
            can_run="\n".join(sorted(kind for kind, able in self._verdicts.items() if able)),
            cannot_run="\n".join(sorted(kind for kind, able in self._verdicts.items() if not able)),
        )


def can_run(kind: str) -> bool:
    """Whether this release can run the tasks of a parked kind."""
    task, why, details = parse_kind(kind)
    task_type = find_task_type(task)
    if task_type is None:
        return False
    if why == UNKNOWN_TYPE:
        return True
    if why == NEWER_FORMAT:
        what, _, version = (details[0] if details else "").partition(":")
        return what in READABLE and version.isdigit() and int(version) <= READABLE[what]
    if why == UNBOUND_ARGUMENTS:
        return signature_fingerprint(task_type.func) not in details
    return False  # a reason of a newer release's making


def _format_kind(raw_message: str, exc: NewerFormat) -> str:
    try:
        task = json.loads(raw_message).get("task")
    except (ValueError, AttributeError):
        task = None
    return kind_of(task if isinstance(task, str) else "?", NEWER_FORMAT, (f"{exc.what}:{exc.version}",))


def _fingerprints(refused_by: str) -> tuple[str, ...]:
    return tuple(part for part in refused_by.split("\1") if part)

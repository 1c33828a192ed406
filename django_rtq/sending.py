"""Sending tasks to Redis: every enqueue, plain or on commit, and what it does while Redis is away.

`enqueue()` is the one way in. A plain enqueue sends at once, and raises BrokerUnavailable if
Redis is away (or, with `RTQ["OUTBOX_FALLBACK"]`, keeps its tasks in the outbox). An enqueue on
commit stores its tasks in the caller's transaction (the transactional outbox: outbox.py) and
sends them once it commits. A process that found Redis away leaves its new tasks to the
workers' relays for a moment (PAUSE_AFTER_OUTAGE), rather than wait on Redis again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import redis
from django.db import Error as DjangoDatabaseError
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError

from .broker.broker import OUTBOX_SENT, OUTBOX_SENT_BEFORE
from .broker.message import TaskMessage
from .conf import get_settings
from .connection import get_broker, note_redis_away, redis_recently_away
from .exceptions import BrokerUnavailable, DuplicateTask, TaskIdConflict
from .message_builder import give_back_unannounced, take_unannounced
from .outbox import Announce, delete_sent, keep, report_dropped, store
from .tracing import carries_trace, sending

logger = logging.getLogger(__name__)

#: Seconds a process that found Redis away leaves its new rows to the relay, rather than have
#: every request wait out the Redis client's retries again.
PAUSE_AFTER_OUTAGE = 5.0


def enqueue(
    messages: Sequence[TaskMessage], *, announce: Announce, on_commit: bool = False
) -> list[TaskMessage]:
    """Send `messages` now, or with `on_commit` once the current transaction commits; return
    them as they landed: a debounced one merged into the copy that waits has that copy's id
    (docs/debounce.md); on commit, or kept in the outbox, as given.

    Now: if Redis is away, raise BrokerUnavailable; or, with `RTQ["OUTBOX_FALLBACK"]`, keep
    them in the outbox (in the current transaction, if any).

    On commit: the transaction is that of `RTQ["OUTBOX_DATABASE"]`, and they are stored in it
    meanwhile. Outside one, they are sent at once, and kept in the outbox if Redis is away.
    With `RTQ["OUTBOX"] = False`, they are sent after the commit without being stored (lost if
    Redis is away then).

    Each carries the trace context of the enqueue's span (tracing.py), if any.
    """
    if not carries_trace():
        return _enqueue(messages, announce=announce, on_commit=on_commit)
    with sending(messages) as traced:
        return _enqueue(traced, announce=announce, on_commit=on_commit)


def _enqueue(messages: Sequence[TaskMessage], *, announce: Announce, on_commit: bool) -> list[TaskMessage]:
    conf = get_settings()
    _announce_signatures()  # before the tasks: a worker that cannot bind them reads it
    if not on_commit:
        if conf.OUTBOX_FALLBACK:
            return _send_or_keep(messages, announce)
        return _send_or_raise(messages, announce)
    using = conf.OUTBOX_DATABASE
    connection = connections[using]
    if not conf.OUTBOX:
        transaction.on_commit(lambda: _send_or_raise(messages, announce), using=using)
    elif connection.in_atomic_block:
        store(messages, using=using)
        transaction.on_commit(lambda: _send_stored(messages, announce=announce, using=using), using=using)
    elif not connection.get_autocommit():
        # What transaction.on_commit() says too: there is no commit to wait for in this mode.
        raise TransactionManagementError("enqueue_on_commit() needs autocommit or an atomic() block.")
    else:
        _send_at_once(messages, announce)
    return list(messages)


def _announce_signatures() -> None:
    """Tell the workers the handler signatures this process binds calls to (a round trip the
    first time a process enqueues a type, and each hour after): one that cannot bind a task's
    arguments then knows whether a release that can still enqueues it."""
    if redis_recently_away():
        return
    signatures = take_unannounced()
    if not signatures:
        return
    try:
        get_broker().announce_signatures(signatures)
    except (BrokerUnavailable, redis.RedisError) as exc:
        give_back_unannounced(signatures)
        logger.debug("could not announce the task signatures: %s", exc)


def _send_or_raise(messages: Sequence[TaskMessage], announce: Announce) -> list[TaskMessage]:
    landed = _landed(messages, get_broker().enqueue(messages))
    announce(landed)
    return landed


def _landed(messages: Sequence[TaskMessage], merged: dict[int, str] | None) -> list[TaskMessage]:
    """The messages sent, each debounced one that was merged with the id of the copy it was
    merged into (`merged`: what Broker.enqueue returns; None from a test's interceptor)."""
    if not merged:
        return list(messages)
    return [replace(m, id=merged[i]) if i in merged else m for i, m in enumerate(messages)]


def _send_at_once(messages: Sequence[TaskMessage], announce: Announce) -> None:
    """`enqueue_on_commit()` outside a transaction: send now, as the outbox does (each id noted
    in `outboxed`, so that if the reply is lost and the tasks are kept, the relay's send writes
    nothing twice), or keep them if Redis is away. A taken id or a held lock raises, as
    `enqueue()` would."""
    if not redis_recently_away():
        try:
            outcomes = get_broker().send_outboxed(messages)
        except BrokerUnavailable as exc:
            _pause(exc)
        else:
            sent = [m for m, outcome in zip(messages, outcomes, strict=True) if outcome == OUTBOX_SENT]
            announce(sent)
            for message, outcome in zip(messages, outcomes, strict=True):
                if outcome != OUTBOX_SENT:
                    raise _refusal(message, outcome)
            return
    keep(messages)


def _send_or_keep(messages: Sequence[TaskMessage], announce: Announce) -> list[TaskMessage]:
    """`RTQ["OUTBOX_FALLBACK"]`: send `messages` now, or keep them in the outbox if Redis is
    away (or was moments ago). Raise BrokerUnavailable only if they cannot be stored either.

    The send is a plain enqueue (atomic per chunk, no `outboxed` ids): a send whose reply was
    lost after Redis took the tasks keeps them all the same, and they may run twice."""
    if not redis_recently_away():
        try:
            merged = get_broker().enqueue(messages)
        except BrokerUnavailable as exc:
            _pause(exc)
        else:
            landed = _landed(messages, merged)
            announce(landed)
            return landed
    keep(messages)
    return list(messages)


def _refusal(message: TaskMessage, outcome: int | Exception) -> Exception:
    """The error `enqueue()` would raise for a task `send_outboxed` did not write."""
    if isinstance(outcome, Exception):
        return outcome
    if outcome == OUTBOX_SENT_BEFORE:
        return TaskIdConflict(
            f"A task with id {message.id!r} already exists in queue {message.queue!r}, or was sent "
            "there from the outbox less than a minute ago."
        )
    return DuplicateTask(
        f"Task {message.task!r} with unique key {message.unique_key!r} is already queued in queue "
        f"{message.queue!r}."
    )


def _send_stored(messages: Sequence[TaskMessage], *, announce: Announce, using: str) -> None:
    """After the commit: send the stored `messages`, then delete their rows. Whatever Redis or
    the database does, it raises nothing: the transaction has committed, and a row left behind
    is the relay's to send. (The error of a test's interceptor, an eager run's, does pass.)"""
    if redis_recently_away():
        return
    try:
        outcomes = get_broker().send_outboxed(messages)
    except BrokerUnavailable as exc:
        _pause(exc)
        return
    except redis.RedisError:
        logger.exception("could not send %d task(s) from the outbox; a worker will retry", len(messages))
        return
    done = [m for m, outcome in zip(messages, outcomes, strict=True) if not isinstance(outcome, Exception)]
    for message, outcome in zip(messages, outcomes, strict=True):
        if outcome == OUTBOX_SENT_BEFORE:
            logger.warning(
                "outbox: task %s (%s) not sent: a task with its id is in queue %r, or was sent there "
                "from the outbox less than a minute ago",
                message.id,
                message.task,
                message.queue,
            )
    report_dropped(messages, outcomes)
    try:
        announce([m for m, outcome in zip(messages, outcomes, strict=True) if outcome == OUTBOX_SENT])
    except Exception:
        logger.exception("a task_enqueued receiver failed")
    try:
        delete_sent(done, using=using)
    except DjangoDatabaseError as exc:
        # Sent all the same: the relay finds the rows, and sending them again writes nothing.
        logger.warning("sent %d task(s) but could not delete their outbox rows: %s", len(done), exc)


def _pause(exc: BrokerUnavailable) -> None:
    if note_redis_away(PAUSE_AFTER_OUTAGE):
        logger.warning(
            "Redis is unreachable (%s): tasks wait in the outbox, and workers send them once it is back",
            exc,
        )

"""The transactional outbox: its rows stored in the caller's transaction, relayed by a worker
when their sender could not send them, and the ids of sent tasks forgotten once rows are gone.

A task of `enqueue_on_commit()` becomes an `OutboxTask` row in the caller's transaction, so it
commits or rolls back with the caller's own writes. Once the transaction commits, the row's task
is sent at once and the row deleted (sending.py). If Redis is away then, the row stays, and a
worker's relay (`worker/relay.py`) sends it once Redis is back. Sending a row twice is harmless:
the queue keeps the ids the outbox sent (`outboxed`) until their rows are gone, and a task whose
id is there, or live in the queue, is not written again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING

from django.core.exceptions import SynchronousOnlyOperation
from django.db import DatabaseError, connections, transaction
from django.db.models import Count, Field, Min, Q
from django.db.models.functions import Now
from django.utils import timezone

from .broker import Broker
from .broker.broker import OUTBOX_DROPPED, OUTBOX_SENT
from .broker.message import TaskMessage
from .conf import get_settings
from .exceptions import BrokerUnavailable
from .tables import migrate_hint, missing_table

if TYPE_CHECKING:
    from .models import OutboxTask

logger = logging.getLogger(__name__)

#: Rows a relay pass takes at once.
RELAY_BATCH = 500
#: Seconds a relay holds the rows it is sending: if it dies, another takes them after this.
LEASE_SECONDS = 15.0
#: Longest wait (seconds) before a row whose task could not be sent is tried again.
MAX_RETRY_SECONDS = 300.0
#: Seconds the queue keeps an id the outbox sent once its row is gone. A row is stored before
#: its task is sent, so this only needs to outlast a transaction still open when its task was
#: sent: that of `OUTBOX_FALLBACK` around an enqueue whose reply was lost.
FORGET_AFTER_SECONDS = 60.0
#: Ids a relay looks at per queue and page when it forgets sent ids, how often it does, and for
#: how long at most (seconds).
FORGET_BATCH = 500
FORGET_INTERVAL = 10.0
FORGET_BUDGET = 2.0

#: Sends `task_enqueued` for the tasks sent (the registry's `announce_enqueued`).
Announce = Callable[[Sequence[TaskMessage]], None]


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """How many tasks wait in the outbox, since when, and how many of them failed to send."""

    waiting: int
    oldest: datetime | None  # when the oldest waiting task was stored
    failing: int  # tasks that a relay tried to send and could not (see their last_error)

    def age_seconds(self, now: datetime | None = None) -> float | None:
        """Seconds the oldest task has waited, or None when the outbox is empty."""
        if self.oldest is None:
            return None
        return max(0.0, ((now or timezone.now()) - self.oldest).total_seconds())


def keep(messages: Sequence[TaskMessage]) -> None:
    """Store `messages` in the outbox because Redis is away, in the current transaction if any,
    or raise BrokerUnavailable."""
    using = get_settings().OUTBOX_DATABASE
    try:
        # A savepoint: if the insert fails, a transaction of the caller is still usable.
        with transaction.atomic(using=using):
            store(messages, using=using)
    except (DatabaseError, SynchronousOnlyOperation) as exc:  # an async caller cannot store them
        raise BrokerUnavailable(
            f"Redis is unreachable and the outbox could not store {len(messages)} task(s): {exc}"
        ) from exc
    logger.info("%d task(s) kept in the outbox while Redis is unreachable", len(messages))


def store(messages: Sequence[TaskMessage], *, using: str) -> None:
    """Write `messages` as outbox rows, in the current transaction if any (all or none)."""
    connection = connections[using]
    sql = _statements(using)
    now = timezone.now()
    due = now + timedelta(seconds=get_settings().OUTBOX_RELAY_AFTER)
    created, due = (sql.time_field.get_db_prep_save(value, connection) for value in (now, due))
    rows = [(m.id, m.task[:255], m.queue, m.to_json(), created, due) for m in messages]
    try:
        if len(rows) == 1:
            with connection.cursor() as cursor:
                cursor.execute(sql.insert, rows[0])
        else:
            with transaction.atomic(using=using), connection.cursor() as cursor:
                cursor.executemany(sql.insert, rows)
    except DatabaseError as exc:
        table = missing_table(exc)
        if table is None:
            raise
        # The same class (callers that catch the database's errors still do), saying what to do.
        raise type(exc)(f"{exc}: {migrate_hint(table, using)}") from exc


@dataclass(frozen=True, slots=True)
class _Statements:
    """The outbox's statements on the path of every request that enqueues, written once: the
    ORM's save() and delete() cost several times the statements themselves (bench/outbox.py)."""

    insert: str  # one row; the columns of `store`
    delete: str  # rows of a queue by task ids: "... IN (" + the ids' placeholders + ")"
    time_field: Field  # prepares times for the database


@cache
def _statements(using: str) -> _Statements:
    from .models import OutboxTask

    quote = connections[using].ops.quote_name
    meta = OutboxTask._meta
    table = quote(meta.db_table)
    column = {field.name: quote(field.column) for field in meta.concrete_fields}
    given = ["task_id", "task_name", "queue", "message", "created_at", "next_attempt_at"]
    return _Statements(
        insert=(
            f"INSERT INTO {table} ({', '.join(column[name] for name in given)}, "
            f"{column['lease']}, {column['attempts']}, {column['last_error']}) "
            f"VALUES ({', '.join(['%s'] * len(given))}, '', 0, '')"
        ),
        delete=f"DELETE FROM {table} WHERE {column['queue']} = %s AND {column['task_id']} IN (",
        time_field=meta.get_field("created_at"),
    )


def relay(broker: Broker, *, using: str, announce: Announce, limit: int = RELAY_BATCH) -> int:
    """Send a batch of the rows due (those whose sender did not delete them), under a lease so
    that concurrent relays take different rows; return how many rows it took.

    Rows whose task Redis has (sent before) are deleted; rows that cannot be sent (a corrupt
    message, a script's error) are kept with the error and tried again later, backing off.
    Raises BrokerUnavailable (the rows are due again at once) and DatabaseError. Times are the
    database's, so that relays on hosts whose clocks disagree agree on leases.
    """
    from .models import OutboxTask

    lease = uuid.uuid4().hex
    pks = _take(using=using, lease=lease, limit=limit)
    if not pks:
        return 0
    rows = list(OutboxTask.objects.using(using).filter(pk__in=pks, lease=lease).order_by("pk"))
    parsed: list[tuple[OutboxTask, TaskMessage]] = []
    failed: list[tuple[OutboxTask, str]] = []
    for row in rows:
        try:
            parsed.append((row, TaskMessage.from_json(row.message, id=row.task_id, queue=row.queue)))
        except ValueError as exc:
            failed.append((row, f"the stored message is not a task message: {exc}"))
    messages = [message for _, message in parsed]
    try:
        outcomes = broker.send_outboxed(messages) if messages else []
    except BrokerUnavailable:
        OutboxTask.objects.using(using).filter(pk__in=pks, lease=lease).update(
            lease="", next_attempt_at=Now()
        )
        raise
    done = []
    for (row, _), outcome in zip(parsed, outcomes, strict=True):
        if isinstance(outcome, Exception):
            failed.append((row, f"{type(outcome).__name__}: {outcome}"))
        else:
            done.append(row.pk)
    report_dropped(messages, outcomes)
    _delete(done, using=using)
    for row, error in failed:
        _retry_later(row, error, using=using)
    sent = [message for message, outcome in zip(messages, outcomes, strict=True) if outcome == OUTBOX_SENT]
    if sent:
        logger.info("relayed %d task(s) from the outbox", len(sent))
        try:
            announce(sent)
        except Exception:
            logger.exception("a task_enqueued receiver failed")
    return len(rows)


def forget_sent(broker: Broker, *, using: str, budget: float = FORGET_BUDGET) -> int:
    """Forget the ids the queues keep of sent tasks whose outbox rows are gone (for longer than
    FORGET_AFTER_SECONDS), a page at a time for about `budget` seconds; return how many."""
    from .models import OutboxTask

    before_ms = broker.server_now_ms() - int(FORGET_AFTER_SECONDS * 1000)
    starts = dict.fromkeys(broker.known_queues(), 0)  # per queue: the ids kept so far, at its head
    deadline = time.monotonic() + budget
    forgotten = 0
    while starts:
        marked = broker.outboxed_before(starts, before_ms, limit=FORGET_BATCH)
        ids = sorted({task_id for found in marked.values() for task_id in found})
        kept = set(OutboxTask.objects.using(using).filter(task_id__in=ids).values_list("task_id", flat=True))
        forget = {queue: [i for i in found if i not in kept] for queue, found in marked.items()}
        broker.forget_outboxed({queue: found for queue, found in forget.items() if found})
        forgotten += sum(map(len, forget.values()))
        starts = {
            queue: starts[queue] + len(found) - len(forget[queue])
            for queue, found in marked.items()
            if len(found) == FORGET_BATCH
        }
        if time.monotonic() >= deadline:
            break
    return forgotten


def outbox_stats(*, using: str | None = None) -> OutboxStats:
    """How many tasks wait in the outbox and since when (one query)."""
    from .models import OutboxTask

    using = using or get_settings().OUTBOX_DATABASE
    # In a savepoint: if the query fails (the table is missing, say), a transaction of the caller
    # (ATOMIC_REQUESTS) is still usable; the surfaces show the rest of their page.
    with transaction.atomic(using=using):
        found = OutboxTask.objects.using(using).aggregate(
            waiting=Count("pk"), oldest=Min("created_at"), failing=Count("pk", filter=Q(attempts__gt=0))
        )
    return OutboxStats(**found)


def _take(*, using: str, lease: str, limit: int) -> list[int]:
    """Lease up to `limit` due rows to this pass; return their pks."""
    from .models import OutboxTask

    rows = OutboxTask.objects.using(using)
    due = rows.filter(next_attempt_at__lte=Now()).order_by("pk")
    until = Now() + timedelta(seconds=LEASE_SECONDS)
    pks = list(due.values_list("pk", flat=True)[:limit])  # one query on every pass of every relay
    if not pks:
        return []
    if connections[using].features.has_select_for_update_skip_locked:
        # Rows another relay is leasing are skipped, not waited for: it takes the next ones.
        with transaction.atomic(using=using):
            pks = list(due.select_for_update(skip_locked=True).values_list("pk", flat=True)[:limit])
            rows.filter(pk__in=pks).update(next_attempt_at=until, lease=lease)
        return pks
    # One statement, atomic: a row another relay leased meanwhile is no longer due.
    rows.filter(pk__in=pks, next_attempt_at__lte=Now()).update(next_attempt_at=until, lease=lease)
    return pks  # those another relay took are not this lease's: relay() reads by both


def delete_sent(messages: Sequence[TaskMessage], *, using: str) -> None:
    """Delete the rows of tasks the queue has now, by queue and id, one statement per queue and
    no transaction of its own. Other rows of the same id and queue, if any, could only be sent
    before (their sends would write nothing), so they go too."""
    if not messages:
        return
    by_queue: dict[str, list[str]] = {}
    for message in messages:
        by_queue.setdefault(message.queue, []).append(message.id)
    delete = _statements(using).delete
    with connections[using].cursor() as cursor:
        for queue, ids in by_queue.items():
            cursor.execute(delete + ", ".join(["%s"] * len(ids)) + ")", [queue, *ids])


def _delete(pks: Sequence[int], *, using: str) -> None:
    from .models import OutboxTask

    if pks:
        OutboxTask.objects.using(using).filter(pk__in=pks).delete()


def _retry_later(row: OutboxTask, error: str, *, using: str) -> None:
    attempts = row.attempts + 1
    wait = min(MAX_RETRY_SECONDS, 2.0**attempts)
    logger.warning(
        "outbox: task %s (%s) could not be sent (attempt %d), tried again in %gs: %s",
        row.task_id,
        row.task_name,
        attempts,
        wait,
        error,
    )
    type(row).objects.using(using).filter(pk=row.pk).update(
        attempts=attempts, last_error=error, lease="", next_attempt_at=Now() + timedelta(seconds=wait)
    )


def report_dropped(messages: Sequence[TaskMessage], outcomes: Sequence[int | Exception]) -> None:
    for message, outcome in zip(messages, outcomes, strict=True):
        if outcome == OUTBOX_DROPPED:
            logger.info(
                "outbox: task %s (%s) dropped: a task with its unique key %r is queued already",
                message.id,
                message.task,
                message.unique_key,
            )

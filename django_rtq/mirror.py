"""The ORM mirror: finished tasks' records, buffered in Redis, written as `FinishedTask` rows."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, models, transaction
from django.db.models.constants import OnConflict

from .broker import Broker
from .broker.attempt import AttemptInfo
from .formats import django_datetime
from .models import FinishedTask

logger = logging.getLogger(__name__)


class MirrorTableMissing(OperationalError):
    """The finished tasks' table does not exist yet (`migrate` has not run): the records wait
    in Redis, as while the database is down, rather than be dropped as unwritable rows."""


#: Errors that mean the database cannot be reached now (retry later), not that a row is bad.
UNAVAILABLE = (OperationalError, InterfaceError)

#: A row to write: FinishedTask's field values by attribute name.
Row = Mapping[str, Any]
#: Rows one pruning statement deletes at most: each DELETE stays short, locking little.
PRUNE_BATCH = 1000


def row_from_record(task_id: str, queue: str, record_json: str) -> FinishedTask:
    """The (unsaved) row of a buffered record, as `buffer_finished` in `_lib.lua` wrote it."""
    return FinishedTask(**values_from_record(task_id, queue, record_json))


def values_from_record(task_id: str, queue: str, record_json: str) -> dict[str, Any]:
    """A buffered record's row as field values by attribute name."""
    record = json.loads(record_json)
    msg = record.get("msg")
    info = AttemptInfo.from_mapping(record.get("info"))
    if not isinstance(msg, dict):  # the message was missing or corrupt
        msg = {"task": "", "args": [], "kwargs": {}}
    succeeded = record.get("status") == "succeeded"
    # The worker's own clock, as precise as the start time; the script's (ms) if it has none.
    finished_at = (info.finished_at if succeeded else info.failed_at) or record["finished_at"] / 1000
    attempted_at = info.attempted_at
    workers = info.workers
    return dict(
        task_id=task_id,
        task_name=_clip(msg.get("task") or ""),
        queue=queue,
        status=FinishedTask.Status.SUCCEEDED if succeeded else FinishedTask.Status.FAILED,
        args=msg.get("args") or [],
        kwargs=msg.get("kwargs") or {},
        priority=msg.get("priority") or 0,
        return_value=record.get("result") if succeeded else None,
        error_class="" if succeeded else _clip(info.error_type or ""),
        error_message="" if succeeded else info.error or "",
        traceback="" if succeeded else info.traceback or "",
        errors=info.errors,
        attempts=max(len(workers), info.retried + 1),
        worker=_clip(info.worker or ""),
        workers=workers,
        enqueued_at=django_datetime(msg.get("enqueued_at")),
        started_at=django_datetime(info.started_at),
        finished_at=django_datetime(finished_at),
        duration=timedelta(seconds=max(0.0, finished_at - attempted_at)) if attempted_at else None,
        parent_id=_clip(msg.get("parent") or ""),
    )


def write_rows(rows: Sequence[Row], *, using: str = "default") -> None:
    """Insert or update the rows by task id, in one transaction: writing a row twice is harmless.

    One prepared upsert run for every row: several times cheaper than `bulk_create`, which
    compiles SQL for each chunk of rows, and the mirror shares the worker's interpreter.
    """
    connection = connections[using]
    sql, columns = _upsert(connection.vendor, using)
    params = [
        [
            row[name] if field is None else field.get_db_prep_save(row[name], connection)
            for name, field in columns
        ]
        for row in rows
    ]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.executemany(sql, params)


@cache
def _upsert(vendor: str, alias: str) -> tuple[str, list[tuple[str, models.Field | None]]]:
    """FinishedTask's upsert statement on a database, and its columns: each field's attribute
    name, with the field where the value needs preparing (None where the driver takes it as is)."""
    connection = connections[alias]
    fields = FinishedTask._meta.concrete_fields
    pk = FinishedTask._meta.pk
    suffix = connection.ops.on_conflict_suffix_sql(
        fields, OnConflict.UPDATE, [f.column for f in fields if f is not pk], [pk.column]
    )
    sql = "INSERT INTO {} ({}) VALUES ({}) {}".format(
        connection.ops.quote_name(FinishedTask._meta.db_table),
        ", ".join(connection.ops.quote_name(field.column) for field in fields),
        ", ".join(["%s"] * len(fields)),
        suffix,
    )
    plain = (models.CharField, models.TextField, models.IntegerField)
    return sql, [(f.attname, None if isinstance(f, plain) else f) for f in fields]


def mirror_batch(
    broker: Broker, queue: str, *, worker_id: str, limit: int, lock_ms: int, using: str = "default"
) -> int:
    """Write one batch of a queue's buffered records to the ORM, then drop them from the buffer.

    Returns how many were mirrored: 0 when the buffer is empty or another worker mirrors the
    queue. Raises a DatabaseError when the database cannot be written: the records stay
    buffered for the next try.
    """
    records = broker.take_finished(queue, worker_id=worker_id, lock_ms=lock_ms, limit=limit)
    if not records:
        return 0
    rows = []
    for task_id, record in records:
        try:
            rows.append(values_from_record(task_id, queue, record))
        except (ValueError, KeyError, TypeError) as exc:
            logger.error(
                "dropping unreadable record of finished task %r in queue %r: %s", task_id, queue, exc
            )
    try:
        write_rows(rows, using=using)
    except UNAVAILABLE:
        raise
    except DatabaseError:
        _require_table(using)  # PostgreSQL and MySQL tell a missing table as a ProgrammingError
        # One bad row (say, text PostgreSQL refuses) must not hold back the others.
        for row in rows:
            _write_one(row, using=using)
    broker.ack_finished(queue, records, worker_id=worker_id)
    return len(records)


def prune_batch(cutoff: datetime, *, limit: int = PRUNE_BATCH, using: str = "default") -> int:
    """Delete up to `limit` rows that finished before `cutoff`, oldest first, by primary key
    (a SELECT of their keys, then one DELETE, each a short statement of its own); return how many."""
    rows = FinishedTask.objects.using(using)
    keys = list(
        rows.filter(finished_at__lt=cutoff).order_by("finished_at").values_list("pk", flat=True)[:limit]
    )
    if not keys:
        return 0
    deleted, _ = rows.filter(pk__in=keys).delete()
    return deleted


def prune(
    cutoff: datetime,
    *,
    using: str = "default",
    limit: int = PRUNE_BATCH,
    rest: Callable[[float], bool] = lambda seconds: True,
) -> int:
    """Delete the rows that finished before `cutoff`, a batch of `limit` at a time, until none is
    left or `rest` says to stop: it is called after each full batch with the seconds the batch
    took, and returns whether to go on (it may pause first). Return how many were deleted."""
    deleted = 0
    while True:
        started = time.monotonic()
        count = prune_batch(cutoff, limit=limit, using=using)
        deleted += count
        if count < limit or not rest(time.monotonic() - started):
            return deleted


def _require_table(using: str) -> None:
    """Raise MirrorTableMissing if the finished tasks' table is not in the database."""
    connection = connections[using]
    table = FinishedTask._meta.db_table
    with connection.cursor() as cursor:
        if table not in connection.introspection.table_names(cursor):
            raise MirrorTableMissing(
                f"the table {table!r} is missing in database {using!r}: run `manage.py migrate`"
            )


def _write_one(row: Row, *, using: str) -> None:
    task_id = row["task_id"]
    try:
        write_rows([row], using=using)
    except UNAVAILABLE:
        raise
    except DatabaseError as exc:
        logger.warning(
            "finished task %r could not be mirrored as is (%s); storing it sanitized", task_id, exc
        )
        row = {name: _sanitized(value) for name, value in row.items()}
        try:
            write_rows([row], using=using)
        except UNAVAILABLE:
            raise
        except DatabaseError:
            logger.exception("finished task %r could not be mirrored; dropped from the buffer", task_id)


def _sanitized(value: Any) -> Any:
    """The value without NUL characters, which PostgreSQL's text and jsonb refuse."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, (list, dict)):
        return json.loads(json.dumps(value).replace("\\u0000", ""))
    return value


def _clip(text: str, length: int = 255) -> str:
    return text[:length]

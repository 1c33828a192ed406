"""The ORM mirror: finished tasks' records, buffered in Redis, written as `FinishedTask` rows."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.utils import timezone

from .broker import Broker
from .models import FinishedTask

logger = logging.getLogger(__name__)

#: Errors that mean the database cannot be reached now (retry later), not that a row is bad.
UNAVAILABLE = (OperationalError, InterfaceError)

_UPDATED_FIELDS = [f.name for f in FinishedTask._meta.concrete_fields if not f.primary_key]


def row_from_record(task_id: str, queue: str, record_json: str) -> FinishedTask:
    """Build the (unsaved) row of a buffered record, as `buffer_finished` in `_lib.lua` wrote it."""
    record = json.loads(record_json)
    msg = record.get("msg")
    info = record.get("info") or {}
    if not isinstance(msg, dict):  # the message was missing or corrupt
        msg = {"task": "", "args": [], "kwargs": {}}
    succeeded = record.get("status") == "succeeded"
    # The worker's own clock, as precise as the start time; the script's (ms) if it has none.
    finished_at = info.get("finished_at" if succeeded else "failed_at") or record["finished_at"] / 1000
    attempted_at = info.get("attempted_at")
    workers = info.get("workers") or []
    return FinishedTask(
        task_id=task_id,
        task_name=_clip(msg.get("task") or ""),
        queue=queue,
        status=FinishedTask.Status.SUCCEEDED if succeeded else FinishedTask.Status.FAILED,
        args=msg.get("args") or [],
        kwargs=msg.get("kwargs") or {},
        priority=msg.get("priority") or 0,
        return_value=record.get("result") if succeeded else None,
        error_class="" if succeeded else _clip(info.get("error_type") or ""),
        error_message="" if succeeded else info.get("error") or "",
        traceback="" if succeeded else info.get("traceback") or "",
        errors=info.get("errors") or [],
        attempts=max(len(workers), int(info.get("retried", 0)) + 1),
        worker=_clip(info.get("worker") or ""),
        workers=workers,
        enqueued_at=as_datetime(msg.get("enqueued_at")),
        started_at=as_datetime(info.get("started_at")),
        finished_at=as_datetime(finished_at),
        duration=timedelta(seconds=max(0.0, finished_at - attempted_at)) if attempted_at else None,
        parent_id=_clip(msg.get("parent") or ""),
    )


def write_rows(rows: Sequence[FinishedTask], *, using: str = "default") -> None:
    """Insert or update the rows by task id, in one statement: writing a row twice is harmless."""
    with transaction.atomic(using=using):
        FinishedTask.objects.using(using).bulk_create(
            rows, update_conflicts=True, unique_fields=["task_id"], update_fields=_UPDATED_FIELDS
        )


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
            rows.append(row_from_record(task_id, queue, record))
        except (ValueError, KeyError, TypeError) as exc:
            logger.error(
                "dropping unreadable record of finished task %r in queue %r: %s", task_id, queue, exc
            )
    try:
        write_rows(rows, using=using)
    except UNAVAILABLE:
        raise
    except DatabaseError:
        # One bad row (say, text PostgreSQL refuses) must not hold back the others.
        for row in rows:
            _write_one(row, using=using)
    broker.ack_finished(queue, records, worker_id=worker_id)
    return len(records)


def _write_one(row: FinishedTask, *, using: str) -> None:
    try:
        write_rows([row], using=using)
    except UNAVAILABLE:
        raise
    except DatabaseError as exc:
        logger.warning("finished task %r could not be mirrored as is (%s); storing it sanitized", row.pk, exc)
        for name in ("args", "kwargs", "return_value"):
            setattr(row, name, _sanitized(getattr(row, name)))
        for name in ("error_message", "traceback"):
            setattr(row, name, getattr(row, name).replace("\x00", ""))
        try:
            write_rows([row], using=using)
        except UNAVAILABLE:
            raise
        except DatabaseError:
            logger.exception("finished task %r could not be mirrored; dropped from the buffer", row.pk)


def _sanitized(value: Any) -> Any:
    """The value without NUL characters, which PostgreSQL's text and jsonb refuse."""
    return json.loads(json.dumps(value).replace("\\u0000", ""))


def as_datetime(epoch_seconds: float | None) -> datetime | None:
    """An epoch time as the ORM wants it: aware in UTC, or naive local time without USE_TZ."""
    if epoch_seconds is None:
        return None
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return moment if settings.USE_TZ else timezone.make_naive(moment)


def _clip(text: str, length: int = 255) -> str:
    return text[:length]

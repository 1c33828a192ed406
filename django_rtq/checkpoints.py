"""Resumable loops over a QuerySet: by primary key in batches, the last key saved as the task's checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Model, QuerySet

from .context import current_task


def _json_key(pk: Any) -> Any:
    """A primary key as a checkpoint holds it: numbers and text as they are, anything else
    (a UUID) as its text, which a lookup on the key takes back."""
    return pk if isinstance(pk, int | str) and not isinstance(pk, bool) else str(pk)


def iterate_batches(queryset: QuerySet, *, batch_size: int = 500) -> Iterator[list[Model]]:
    """Yield the queryset's objects in lists of `batch_size`, by primary key ascending (its own
    ordering is replaced). Inside a task run by a worker, once a batch was handled (the loop
    asks for the next one) its last key is saved as the task's checkpoint, and a later run of
    the task (after a shutdown, a killed worker, a retry) starts after the key saved last: at
    most one batch is handled twice after a crash, none after a graceful shutdown, which stops
    the task at the checkpoint (`save_checkpoint` raises StoppedAtCheckpoint). Rows added
    behind the cursor meanwhile are not seen, as with any keyset pagination."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    task = current_task()
    after = task.checkpoint if task is not None else None
    ordered = queryset.order_by("pk")
    while True:
        page = ordered if after is None else ordered.filter(pk__gt=after)
        batch = list(page[:batch_size])
        if not batch:
            return
        yield batch
        after = _json_key(batch[-1].pk)
        if task is not None:
            task.save_checkpoint(after)
        if len(batch) < batch_size:
            return


def iterate_queryset(queryset: QuerySet, *, batch_size: int = 500) -> Iterator[Model]:
    """Yield the queryset's objects one by one, by primary key ascending, fetched and
    checkpointed in batches as `iterate_batches` does."""
    for batch in iterate_batches(queryset, batch_size=batch_size):
        yield from batch

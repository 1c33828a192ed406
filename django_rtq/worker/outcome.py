"""How a failed attempt is settled: retry with backoff, or archive, with the error recorded."""

from __future__ import annotations

import logging
import traceback as tb
from dataclasses import dataclass
from typing import Any

from ..broker import Broker, ClaimedTask, TaskMessage, TaskState
from ..exceptions import DeadlineExceeded, NonRetryableError, TaskCancelled
from ..registry import get_task_type

logger = logging.getLogger(__name__)

#: Errors that archive a task at once, whatever retries it has left.
NON_RETRYABLE = (NonRetryableError, DeadlineExceeded, TaskCancelled)


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A failed attempt (or a task that could not even start) to settle."""

    claimed: ClaimedTask
    message: TaskMessage | None  # None when the message is missing or corrupt
    error: BaseException
    traceback: str = ""
    started_at: float | None = None


def error_path(exc: BaseException) -> str:
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def format_traceback(exc: BaseException) -> str:
    return "".join(tb.format_exception(exc))


def settle_failure(
    broker: Broker, failure: Failure, *, worker_id: str, lease_cutoff_ms: int = 0
) -> TaskState | None:
    """Send the task to retry or archived; return where it went, None if it was not ours to move."""
    claimed, message, exc = failure.claimed, failure.message, failure.error
    now = broker.clock()
    retried = int(claimed.info.get("retried", 0))
    info: dict[str, Any] = {
        **claimed.info,
        "error_type": error_path(exc),
        "error": str(exc) or error_path(exc),
        "traceback": failure.traceback,
        "failed_at": now,
        "started_at": failure.started_at,
        "worker": worker_id,
    }
    retryable = (
        message is not None
        and not isinstance(exc, NON_RETRYABLE)
        and retried < message.max_retries
        and (message.deadline is None or message.deadline > now)
    )
    retry_at_ms = 0
    if retryable:
        task_type = get_task_type(message.task)
        delay = task_type.retry_backoff(retried, exc) if task_type else 0.0
        retry_at_ms = int((now + max(0.0, delay)) * 1000)
        info["retried"] = retried + 1
    target = TaskState.RETRY if retryable else TaskState.ARCHIVED
    moved = broker.fail(
        claimed.queue,
        claimed.id,
        worker_id=worker_id,
        to=target,
        retry_at_ms=retry_at_ms,
        info=info,
        unique_key=message.unique_key if message else None,
        lease_cutoff_ms=lease_cutoff_ms,
    )
    if not moved:
        return None
    name = message.task if message else "?"
    if retryable:
        logger.warning(
            "task %r (%s) of queue %r failed (%s: %s); retry %d of %d in %.1fs",
            claimed.id,
            name,
            claimed.queue,
            info["error_type"],
            info["error"],
            retried + 1,
            message.max_retries,
            retry_at_ms / 1000 - now,
        )
    else:
        logger.error(
            "task %r (%s) of queue %r failed (%s: %s); archived",
            claimed.id,
            name,
            claimed.queue,
            info["error_type"],
            info["error"],
        )
    return target

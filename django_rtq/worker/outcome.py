"""How a failed attempt is settled: retry with backoff, or archive, with the error recorded."""

from __future__ import annotations

import logging
import traceback as tb
from dataclasses import dataclass
from typing import Any

from .. import signals
from ..broker import Broker, ClaimedTask, TaskMessage, TaskState
from ..exceptions import DeadlineExceeded, NonRetryableError, TaskCancelled
from ..registry import get_task_type

logger = logging.getLogger(__name__)

#: Errors that archive a task at once, whatever retries it has left.
NON_RETRYABLE = (NonRetryableError, DeadlineExceeded, TaskCancelled)
#: Errors kept in a task's info, the latest ones (each attempt's error, with its traceback).
ERRORS_KEPT = 10


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


def attempt_info(info: dict[str, Any], worker_id: str, started_at: float | None) -> dict[str, Any]:
    """A task's info with the attempt that just ended added: who ran it and when it started."""
    return {
        **info,
        "started_at": info.get("started_at") or started_at,  # of the first attempt
        "attempted_at": started_at,  # of the latest attempt
        "worker": worker_id,
        "workers": [*info.get("workers", ()), worker_id],  # one per attempt
    }


def settle_failure(
    broker: Broker, failure: Failure, *, worker_id: str, lease_cutoff_ms: int = 0
) -> TaskState | None:
    """Send the task to retry or archived; return where it went, None if it was not ours to move."""
    claimed, message, exc = failure.claimed, failure.message, failure.error
    now = broker.clock()
    retried = int(claimed.info.get("retried", 0))
    error = {"type": error_path(exc), "message": str(exc) or error_path(exc), "traceback": failure.traceback}
    info: dict[str, Any] = {
        **attempt_info(claimed.info, worker_id, failure.started_at),
        "error_type": error["type"],
        "error": error["message"],
        "traceback": failure.traceback,
        "errors": [*claimed.info.get("errors", ()), error][-ERRORS_KEPT:],
        "failed_at": now,
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
    _send_failure_signal(message, exc, retry_at_ms / 1000 if retryable else None)
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


def _send_failure_signal(message: TaskMessage | None, error: BaseException, retry_at: float | None) -> None:
    signal = signals.task_retried if retry_at is not None else signals.task_failed
    if not signal.receivers:
        return
    sender = get_task_type(message.task) if message else None
    extra = {"retry_at": retry_at} if retry_at is not None else {}
    signal.send(sender, message=message, error=error, **extra)

"""How a failed attempt is settled: retry with backoff, or archive, with the error recorded."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.dispatch import Signal

from .. import signals
from ..broker import Broker, ClaimedTask, TaskMessage, TaskState
from ..broker.attempt import AttemptInfo, will_retry
from ..broker.inspect import Inspector
from ..exceptions import BrokerUnavailable, TaskCancelled
from ..registry import get_task_type
from ..retry import exponential_backoff

logger = logging.getLogger(__name__)
#: The line each finished attempt gets: a success at INFO (unless RTQ["LOG_FINISHED_TASKS"] is
#: False), a failure to be retried or a cancellation at WARNING, an archived task at ERROR.
task_logger = logging.getLogger("django_rtq.tasks")


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """A failed attempt (or a task that could not even start) to settle."""

    claimed: ClaimedTask
    message: TaskMessage | None  # None when the message is missing or corrupt
    error: BaseException
    traceback: str = ""
    started_at: float | None = None


def send_robust(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send a signal; a receiver that raises is logged, and neither stops the others nor the task."""
    if not signal.receivers:
        return
    for receiver, response in signal.send_robust(sender, **kwargs):
        if isinstance(response, Exception):
            logger.error("a receiver of a django-rtq signal (%r) raised", receiver, exc_info=response)


def retry_delay(message: TaskMessage, retried: int, exc: BaseException) -> float:
    """Seconds until the next attempt, from the task type's backoff; the default one if that
    fails (a backoff that raises must not keep a task from being settled)."""
    task_type = get_task_type(message.task)
    if task_type is None:
        return 0.0
    try:
        return max(0.0, float(task_type.retry_backoff(retried, exc)))
    except Exception:
        logger.exception("the retry backoff of %s failed; using the default one", message.task)
        return exponential_backoff(retried, exc)


def settle_failure(broker: Broker, failure: Failure, *, worker_id: str) -> TaskState | None:
    """Send the task to retry or archived; return where it went, None if the result came late."""
    claimed, message, exc = failure.claimed, failure.message, failure.error
    now = broker.clock()
    facts = AttemptInfo.from_mapping({**claimed.info, **claimed.checkpoint})  # its latest checkpoint
    retried = facts.retried
    retryable = message is not None and will_retry(
        exc, retried=retried, max_retries=message.max_retries, deadline=message.deadline, now=now
    )
    info = facts.failed(
        exc,
        failure.traceback,
        worker_id=worker_id,
        started_at=failure.started_at,
        failed_at=now,
        retrying=retryable,
    )
    retry_at_ms = int((now + retry_delay(message, retried, exc)) * 1000) if retryable else 0
    target = TaskState.RETRY if retryable else TaskState.ARCHIVED
    moved = broker.fail(
        claimed.queue,
        claimed.id,
        worker_id=worker_id,
        run=claimed.run,
        to=target,
        retry_at_ms=retry_at_ms,
        info=info,
        unique_key=message.unique_key if message else None,
    )
    if not moved:
        tell_left_out(broker, claimed.queue, {claimed.id: claimed.run}, settled=0, what="failure")
        return None
    _send_failure_signal(message, exc, retry_at_ms / 1000 if retryable else None, info)
    name = message.task if message else "?"
    ran = f"after {now - failure.started_at:.3f}s" if failure.started_at is not None else "before it started"
    if retryable:
        level, outcome = logging.WARNING, "failed-will-retry"
        said = f"failed {ran} ({info['error_type']}: {info['error']}); retry {retried + 1} of "
        said += f"{message.max_retries} in {max(0.0, retry_at_ms / 1000 - now):.1f}s"
    elif isinstance(exc, TaskCancelled):
        level, outcome = logging.WARNING, "cancelled"
        said = f"cancelled {ran} ({info['error']}); archived"
    else:
        level, outcome = logging.ERROR, "archived"
        said = f"failed {ran} ({info['error_type']}: {info['error']}); archived"
    duration = None if failure.started_at is None else now - failure.started_at
    log_finished(level, claimed.id, name, claimed.queue, said, outcome=outcome, duration=duration)
    return target


def log_finished(
    level: int, task_id: str, name: str, queue: str, said: str, *, outcome: str, duration: float | None
) -> None:
    """Log the line of a finished attempt on "django_rtq.tasks": "task 'id' (type) of queue 'q'
    `said`", with its facts as the record's attributes too (for structured logging)."""
    facts = {"task_id": task_id, "task_name": name, "queue": queue, "outcome": outcome, "duration": duration}
    task_logger.log(level, "task %r (%s) of queue %r %s", task_id, name, queue, said, extra=facts)


def tell_left_out(broker: Broker, queue: str, runs: dict[str, str], *, settled: int, what: str) -> None:
    """Log the outcomes (`what`: "result" or "failure") of a settle that left some out, telling
    those that came late (a newer run of the task had started: fenced by run number) from those
    whose task no longer exists (deleted, or lost with Redis's data)."""
    left = len(runs) - settled
    if left <= 0:
        return
    try:
        now = Inspector(broker).runs(queue, list(runs))
    except BrokerUnavailable:
        logger.warning(
            "%d of %d %s(s) in queue %r were left out: a newer run of the task had started, or the "
            "task no longer exists",
            left,
            len(runs),
            what,
            queue,
        )
        return
    late = [task_id for task_id, run in runs.items() if now[task_id] is not None and now[task_id] != run]
    if late:
        logger.warning(
            "%d %s(s) in queue %r came late and were left out (a newer run of the task had started): %s",
            len(late),
            what,
            queue,
            ", ".join(late),
        )
    gone = left - len(late)
    if gone > 0:
        # Without a run number the task is gone; the ids of a settle whose settled tasks were
        # deleted at once (no retention) are ambiguous, so only the count is certain then.
        missing = [task_id for task_id, run in runs.items() if now[task_id] is None]
        logger.warning(
            "%d %s(s) in queue %r were left out because the task no longer exists in Redis "
            "(deleted, or lost with Redis's data: see any 'restarted without its data' error)%s",
            gone,
            what,
            queue,
            ": " + ", ".join(missing) if len(missing) == gone else "",
        )


def _send_failure_signal(
    message: TaskMessage | None, error: BaseException, retry_at: float | None, info: dict[str, Any]
) -> None:
    signal = signals.task_retried if retry_at is not None else signals.task_failed
    if not signal.receivers:
        return
    sender = get_task_type(message.task) if message else None
    extra = {"retry_at": retry_at} if retry_at is not None else {}
    send_robust(signal, sender, message=message, error=error, info=info, **extra)

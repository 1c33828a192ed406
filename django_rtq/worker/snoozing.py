"""How an attempt whose handler raised Snooze is settled: scheduled again, no attempt counted."""

from __future__ import annotations

import dataclasses
import logging

from .. import signals
from ..broker import Broker, TaskState
from ..broker.attempt import AttemptInfo
from ..broker.snoozing import snooze
from ..exceptions import Snooze, TooManySnoozes
from ..registry import get_task_type
from .outcome import Failure, log_finished, send_robust, settle_failure, tell_left_out


def settle_snooze(broker: Broker, failure: Failure, *, worker_id: str, max_snoozes: int) -> TaskState | None:
    """Send a task whose handler raised Snooze to scheduled (its type held if asked), or archive
    it (TooManySnoozes) once it has snoozed `max_snoozes` times; return where it went, None if
    the outcome came late."""
    claimed, message, request = failure.claimed, failure.message, failure.error
    assert isinstance(request, Snooze)
    facts = AttemptInfo.from_mapping(claimed.info)
    if message is None or facts.snoozed >= max_snoozes:
        error = TooManySnoozes(
            f"snoozed {facts.snoozed} times, the most RTQ['MAX_SNOOZES'] allows ({max_snoozes})"
        )
        return settle_failure(broker, dataclasses.replace(failure, error=error), worker_id=worker_id)
    now = broker.clock()
    info = facts.snoozing(now)
    due_ms = snooze(
        broker,
        claimed.queue,
        claimed.id,
        worker_id=worker_id,
        run=claimed.run,
        delay_ms=round(request.seconds * 1000),
        info=info,
        hold_task=message.task if request.hold_type else None,
    )
    if due_ms is None:
        tell_left_out(broker, claimed.queue, {claimed.id: claimed.run}, settled=0, what="snooze")
        return None
    if signals.task_snoozed.receivers:
        send_robust(
            signals.task_snoozed,
            get_task_type(message.task),
            message=message,
            seconds=request.seconds,
            hold_type=request.hold_type,
            until=due_ms / 1000,
            snoozed=info["snoozed"],
        )
    held = f"; its type {message.task} held until then" if request.hold_type else ""
    said = (
        f"snoozed for {request.seconds:g}s (snooze {info['snoozed']} of at most {max_snoozes}, "
        f"no attempt counted){held}"
    )
    duration = None if failure.started_at is None else now - failure.started_at
    log_finished(
        logging.INFO, claimed.id, message.task, claimed.queue, said, outcome="snoozed", duration=duration
    )
    return TaskState.SCHEDULED

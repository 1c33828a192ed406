"""How an attempt whose handler raised Snooze is settled: scheduled again, no attempt counted."""

from __future__ import annotations

import dataclasses
import logging

from .. import signals
from ..broker import Broker, TaskState
from ..broker.attempt import AttemptInfo
from ..broker.limits import partition_scope
from ..broker.message import TaskMessage
from ..broker.snoozing import snooze
from ..exceptions import Snooze, TooManySnoozes
from ..registry import get_task_type
from .outcome import Failure, log_finished, send_robust, settle_failure, tell_left_out

logger = logging.getLogger(__name__)


def settle_snooze(broker: Broker, failure: Failure, *, worker_id: str, max_snoozes: int) -> TaskState | None:
    """Send a task whose handler raised Snooze to scheduled (its type or its partition held if
    asked), or archive it (TooManySnoozes) once it has snoozed `max_snoozes` times; return where
    it went, None if the outcome came late."""
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
    hold = hold_of(request, message, queue=claimed.queue, task_id=claimed.id)
    due_ms = snooze(
        broker,
        claimed.queue,
        claimed.id,
        worker_id=worker_id,
        run=claimed.run,
        delay_ms=round(request.seconds * 1000),
        info=info,
        hold_task=hold,
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
            hold_partition=request.hold_partition and hold is not None,
            until=due_ms / 1000,
            snoozed=info["snoozed"],
        )
    held = ""
    if request.hold_type:
        held = f"; its type {message.task} held until then"
    elif hold is not None:
        held = f"; its partition {message.partition} held until then"
    said = (
        f"snoozed for {request.seconds:g}s (snooze {info['snoozed']} of at most {max_snoozes}, "
        f"no attempt counted){held}"
    )
    duration = None if failure.started_at is None else now - failure.started_at
    log_finished(
        logging.INFO, claimed.id, message.task, claimed.queue, said, outcome="snoozed", duration=duration
    )
    return TaskState.SCHEDULED


def hold_of(request: Snooze, message: TaskMessage, *, queue: str, task_id: str) -> str | None:
    """The flow-control scope a snooze holds until it ends: the task's type (`hold_type`), its
    partition's scope (`hold_partition`), or none. A task without a partition asked to hold it
    holds nothing but itself (see Snooze), with a warning."""
    if request.hold_type:
        return message.task
    if not request.hold_partition:
        return None
    if message.partition is None:
        logger.warning(
            "Task %s (%s) in queue %s snoozed with hold_partition=True but has no partition: only "
            "the task itself waits (hold_type=True holds its whole type).",
            task_id,
            message.task,
            queue,
        )
        return None
    return partition_scope(message.task, message.partition)

"""A running task's checkpoint: saved in its info, fenced by the run that holds the task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .versions import CHECKPOINT_SINCE

if TYPE_CHECKING:
    from .broker import Broker

#: The longest checkpoint (characters of its JSON) a task may save: a cursor, not a payload.
CHECKPOINT_LIMIT = 64 * 1024


def save_checkpoint(
    broker: Broker, queue: str, task_id: str, *, worker_id: str, run: str, value_json: str
) -> float | None:
    """Save the checkpoint of the run `run` of a task held by `worker_id`; return when it was
    saved (epoch seconds, Redis's clock), or None if that run no longer holds the task (its
    lease was lost and the task given to another run). BrokerUnavailable if Redis is away."""
    qk = broker.queue(queue)
    saved_ms = broker.run_script(
        "save_checkpoint",
        [qk.active, qk.owner, qk.runs, qk.info],
        [broker.clock_arg(), task_id, worker_id, run, value_json, CHECKPOINT_SINCE],
    )
    return int(saved_ms) / 1000 if saved_ms else None

"""What a running handler can learn about its own task, and the checkpoints it saves."""

from __future__ import annotations

import json
import logging
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .broker.claims import ClaimedTask
from .broker.versions import CHECKPOINT_SINCE
from .exceptions import BrokerUnavailable, CheckpointNotSaved, LeaseLost, StoppedAtCheckpoint

if TYPE_CHECKING:
    from .broker import Broker

logger = logging.getLogger(__name__)
_CHECKPOINT_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


@dataclass(slots=True, kw_only=True)
class RunHandle:
    """What a run needs to save checkpoints: its claim (the fencing token `run`, and where the
    facts it saved are kept for its settling), its worker and that worker's broker (None: the
    process's), and whether that worker is stopping."""

    claimed: ClaimedTask
    worker_id: str
    broker: Broker | None = None
    stopping: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskContext:
    """The task a handler is running for."""

    id: str
    task: str  # task type name
    queue: str
    retried: int  # retries before this attempt
    max_retries: int
    worker_id: str = ""
    enqueued_at: float = 0.0  # epoch seconds
    priority: int = 0  # as enqueued
    process_at: float | None = None  # when it was enqueued to run, if later than at once
    started_at: float = 0.0  # of this attempt, epoch seconds
    deadline: float | None = None  # epoch seconds by which it must have finished, if any
    info: dict = field(default_factory=dict)  # attempt facts before this attempt (workers, errors)
    #: The worker's handle on this run (None outside a worker: checkpoints are then kept in memory).
    handle: RunHandle | None = field(default=None, repr=False, compare=False)
    #: The latest checkpoint (JSON text, when saved), from the info until this run saves one.
    _saved: dict = field(default_factory=dict, repr=False, compare=False)

    def progress(self, done: float, total: float | None = None) -> None:
        """Report how far the task has come (`done` of `total`), for the inspector and admin."""
        from .broker.workflow import set_progress
        from .connection import get_broker

        set_progress(get_broker(), self.queue, self.id, done, total)

    @property
    def checkpoint(self) -> Any:
        """The latest checkpoint saved for this task: by an earlier run (None on the first run,
        or if none was saved) until this run saves one."""
        raw = self._saved.get("checkpoint", self.info.get("checkpoint"))
        return json.loads(raw) if isinstance(raw, str) else None

    @property
    def checkpointed_at(self) -> float | None:
        """When the latest checkpoint was saved, epoch seconds (Redis's clock)."""
        return self._saved.get("checkpointed_at", self.info.get("checkpointed_at"))

    @property
    def stopping(self) -> bool:
        """Whether the worker running this task is shutting down."""
        return self.handle is not None and self.handle.stopping.is_set()

    def save_checkpoint(self, value: Any) -> bool:
        """Save how far the task has come (a JSON-serialisable value, a cursor of 64 KiB at
        most): a later run of the task (after a shutdown, a lost lease, a killed worker, a
        retry) reads it as `checkpoint`. Return True once saved; False if Redis is away (the
        previous checkpoint stands; the next save tries again). Raise CheckpointNotSaved for a
        value that cannot be saved, LeaseLost if this run no longer holds the task (a newer run
        does), and StoppedAtCheckpoint once saved if the worker is shutting down: the handler
        ends there and the task goes back to pending, uncounted."""
        from .broker.checkpoint import CHECKPOINT_LIMIT, save_checkpoint
        from .connection import get_broker

        try:
            value_json = _CHECKPOINT_ENCODER.encode(value)
        except (TypeError, ValueError) as exc:
            raise CheckpointNotSaved(f"a checkpoint must be JSON-serialisable: {exc}") from exc
        if len(value_json) > CHECKPOINT_LIMIT:
            raise CheckpointNotSaved(
                f"a checkpoint takes at most {CHECKPOINT_LIMIT} characters of JSON, not {len(value_json)}"
            )
        handle = self.handle
        if handle is None:
            self._saved.update(checkpoint=value_json, checkpointed_at=None)
            return True
        claimed = handle.claimed
        try:
            saved_at = save_checkpoint(
                handle.broker or get_broker(),
                self.queue,
                self.id,
                worker_id=handle.worker_id,
                run=claimed.run,
                value_json=value_json,
            )
        except BrokerUnavailable as exc:
            logger.warning("could not save the checkpoint of task %r (%s): %s", self.id, self.task, exc)
            return False
        if saved_at is None:
            raise LeaseLost("this run no longer holds the task: its checkpoint was not saved")
        facts = {"checkpoint": value_json, "checkpointed_at": saved_at}
        self._saved.update(facts)
        version = claimed.info.get("v")
        claimed.checkpoint.update(
            facts, v=max(version, CHECKPOINT_SINCE) if isinstance(version, int) else CHECKPOINT_SINCE
        )
        if handle.stopping.is_set():
            raise StoppedAtCheckpoint("the worker is shutting down: stopped at the checkpoint just saved")
        return True


_current: ContextVar[TaskContext | None] = ContextVar("rtq_current_task", default=None)


def current_task() -> TaskContext | None:
    """Return the task being run, inside a handler run by a worker; None elsewhere."""
    return _current.get()


def set_current_task(context: TaskContext | None) -> None:
    _current.set(context)

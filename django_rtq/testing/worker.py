"""Run a real in-process worker until its queues are drained, and say what it did."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import signals
from ..broker.message import TaskMessage
from ..exceptions import BrokerUnavailable
from ..worker.server import EXIT_REDIS_UNREACHABLE, Worker

#: Seconds a burst may take by default before it is stopped and BurstTimeout raised.
DEFAULT_BURST_TIMEOUT = 30.0
#: Seconds to wait for a stopped worker's threads, beyond its shutdown timeout.
STOP_GRACE = 5.0


class BurstTimeout(AssertionError):
    """The burst worker did not drain its queues in time (it was stopped)."""


@dataclass
class BurstSummary:
    """What a burst worker did, counted from its signals: attempts that succeeded, failed and
    will be retried (`retried`), or failed for good (`archived`)."""

    succeeded: int = 0
    retried: int = 0
    archived: int = 0
    #: task id -> return value of its successful attempt
    results: dict[str, Any] = field(default_factory=dict)
    #: task id -> error of its latest failed attempt
    errors: dict[str, BaseException] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        """Attempts that raised: retried or archived."""
        return self.retried + self.archived


def run_worker_burst(
    queues: Iterable[str] | dict[str, int] | None = None,
    *,
    concurrency: int = 1,
    timeout: float = DEFAULT_BURST_TIMEOUT,
    shutdown_timeout: float | None = None,
    give_up_after: float | None = None,
) -> BurstSummary:
    """Run a `Worker` with `burst=True` on the configured broker (the real Redis, or the fake
    one under `use_fake_redis`) until its queues (RTQ["QUEUES"] unless given) have nothing
    pending nor due; return a summary. Handlers run in the worker's threads, as in production.

    Raises BurstTimeout, once the worker stopped, if the queues are not drained in `timeout`
    seconds; BrokerUnavailable if Redis stayed unreachable for `give_up_after` seconds (the
    worker's default, 30, unless given); RuntimeError if a thread of the worker died; and what
    the worker itself raised.
    """
    if queues is not None and not isinstance(queues, dict):
        queues = dict.fromkeys(queues, 1)
    worker = Worker(
        queues=queues,
        concurrency=concurrency,
        burst=True,
        shutdown_timeout=shutdown_timeout,
        give_up_after=give_up_after,
        watch_redis=False,  # a test's Redis (or fakeredis) is not the one to warn of
    )
    summary = BurstSummary()
    lock = threading.Lock()

    def ours(message: TaskMessage | None) -> bool:
        return message is not None and message.queue in worker.queues

    def succeeded(sender: Any, message: TaskMessage, result: Any = None, **_: Any) -> None:
        if ours(message):
            with lock:
                summary.succeeded += 1
                summary.results[message.id] = result

    def retried(sender: Any, message: TaskMessage, error: BaseException, **_: Any) -> None:
        if ours(message):
            with lock:
                summary.retried += 1
                summary.errors[message.id] = error

    def archived(sender: Any, message: TaskMessage | None, error: BaseException, **_: Any) -> None:
        if ours(message):
            with lock:
                summary.archived += 1
                summary.errors[message.id] = error  # type: ignore[union-attr]

    receivers = (
        (signals.task_succeeded, succeeded),
        (signals.task_retried, retried),
        (signals.task_failed, archived),
    )
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    status: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            status.append(worker.run())
        except BaseException as exc:  # raised again in the caller's thread below
            errors.append(exc)

    thread = threading.Thread(target=run, name="rtq-burst-worker", daemon=True)
    try:
        # Its own thread: Worker.run() in the main thread would take over SIGINT and SIGTERM.
        thread.start()
        thread.join(timeout)
        timed_out = thread.is_alive()
        if timed_out:
            worker.request_stop()
            thread.join(worker.shutdown_timeout + STOP_GRACE)
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    if timed_out:
        raise BurstTimeout(
            f"The burst worker did not drain queues {', '.join(worker.queues)} within {timeout}s "
            f"(so far: {summary.succeeded} succeeded, {summary.failed} failed); it was stopped. "
            f"A task still running, or more tasks keep coming?"
        )
    if errors:
        raise errors[0]
    if status == [EXIT_REDIS_UNREACHABLE]:
        raise BrokerUnavailable(
            f"The burst worker gave up: Redis was unreachable for {worker.give_up_after}s."
        )
    if status != [0]:
        raise RuntimeError("The burst worker stopped because one of its threads died: see the log.")
    return summary

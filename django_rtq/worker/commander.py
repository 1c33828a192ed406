"""The commander applies workflow commands: a child's outcome to its workflow, a workflow's
next steps to their queues (see django_rtq/workflows/commands.py)."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence

from ..broker import Broker
from ..broker.attempt import error_path
from ..broker.workflow import cancel_workflow
from ..exceptions import BrokerUnavailable, CorruptWorkflow
from ..workflows.commands import apply_due, workflow_of
from .component import Component

#: Times the commander tries a command that keeps failing with an error other than Redis being
#: unavailable (a bug, or data nobody foresaw) before it gives the command up.
MAX_COMMAND_ATTEMPTS = 5
#: Seconds before a failed command is tried again, doubled after each failure (1, 2, 4, 8).
COMMAND_RETRY_DELAY = 1.0
#: Seconds a command's failures are remembered; one not seen failing for that long (another
#: worker applied it, say) starts counting again.
FORGET_FAILURES_AFTER = 600.0
#: Characters of a given-up command's JSON that are logged.
LOGGED_BODY = 10_000
CORRUPT_WORKFLOW = error_path(CorruptWorkflow)


class CommandRetries:
    """The commander's retry policy (a RetryPolicy of workflows/commands.py): a command that
    fails is tried again after COMMAND_RETRY_DELAY seconds, then twice as long each time, and
    given up at its MAX_COMMAND_ATTEMPTS-th failure. Failures are counted per worker and per
    version of the command (a command rewritten meanwhile counts afresh), so every worker may
    try it that often before one gives it up.

    Giving up removes the command unapplied, logged at ERROR with its id and JSON, so that
    someone can apply it by hand. Its workflow, if the command says which it is, is archived
    as corrupt (cancel_workflow: its unfinished children cancelled, its own workflow told). That is
    safe, and better than retrying forever: the scripts that apply commands fail a corrupt
    workflow by themselves, so what ends here is an error nobody foresaw, which another try
    would meet again; the workflow could never finish without that command (a child's outcome
    lost, children never started, a start that never came), so it would wait for good. What
    is lost: the command's effect, and the workflow, which fails instead of finishing. A
    cancel command given up leaves its workflow's unstarted children to run, their outcome
    ignored. A command that fails for a reason outside its workflow which someone may repair
    (a key of a child's queue holding the wrong type, say) is given up all the same, about 15
    seconds after its first failure. Errors of Redis being unavailable are never counted: they
    pass by themselves.
    """

    def __init__(
        self,
        broker: Broker,
        logger: logging.Logger,
        *,
        attempts: int = MAX_COMMAND_ATTEMPTS,
        delay: float = COMMAND_RETRY_DELAY,
    ) -> None:
        self.broker = broker
        self.logger = logger
        self.attempts = attempts
        self.delay = delay
        self._failures: dict[tuple[str, str, str], tuple[int, float]] = {}  # -> count, last failure

    def failed(self, queue: str, cmd_id: str, body: str, error: Exception) -> float | None:
        now = time.monotonic()
        self._failures = {
            key: seen for key, seen in self._failures.items() if now - seen[1] < FORGET_FAILURES_AFTER
        }
        key = (queue, cmd_id, hashlib.sha1(body.encode()).hexdigest())
        count = self._failures.get(key, (0, now))[0] + 1
        self._failures[key] = (count, now)
        if count < self.attempts:
            return self.delay * 2 ** (count - 1)
        self._give_up(queue, cmd_id, body, error, count)  # BrokerUnavailable: given up next time
        del self._failures[key]
        return None

    def _give_up(self, queue: str, cmd_id: str, body: str, error: Exception, count: int) -> None:
        shown = body if len(body) <= LOGGED_BODY else f"{body[:LOGGED_BODY]}... ({len(body)} characters)"
        self.logger.error(
            "giving up command %r of queue %r after %d failed attempts (%s: %s); dropped, unapplied: %s",
            cmd_id, queue, count, type(error).__name__, error, shown,
        )  # fmt: skip
        target = workflow_of(queue, cmd_id, body)
        if target is None:
            return
        workflow_queue, workflow_id = target
        message = f"corrupt workflow: its command {cmd_id!r} could not be applied ({error})"
        try:
            failed = cancel_workflow(
                self.broker, workflow_queue, workflow_id, error_type=CORRUPT_WORKFLOW, message=message
            )
        except BrokerUnavailable:
            raise
        except Exception:
            self.logger.exception("could not archive workflow %r of queue %r", workflow_id, workflow_queue)
            return
        if failed:
            self.logger.error("workflow %r of queue %r archived: %s", workflow_id, workflow_queue, message)


class Commander(Component):
    """Applies the commands of its queues (and those they lead to in other queues) every
    `interval` seconds, and at once when `wake()` says a task of its worker wrote one."""

    name = "commands"

    def __init__(self, *, broker: Broker, queues: Sequence[str], interval: float) -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.queues = list(queues)
        self.retries = CommandRetries(broker, self.logger)
        self._wake = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def run_once(self) -> int:
        return apply_due(self.broker, self.queues, retry=self.retries)

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        super().stop(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.run_once()
            except BrokerUnavailable as exc:
                self.logger.debug("commands pass skipped: %s", exc)  # the healthchecker tells
            except Exception:
                self.logger.exception("commands pass failed")
            self._wake.wait(self.interval)

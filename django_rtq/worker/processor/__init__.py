"""The processor claims tasks from its queues in batches, runs them on threads, and settles them."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from ...broker import Broker
from ..syncer import Syncer
from .executor import Executor
from .fetcher import Fetcher
from .jobs import JobTable, give_back, ids_by_queue
from .settler import Settler
from .watchdog import Watchdog, lease_budget

logger = logging.getLogger(__name__)


class Processor:
    """The processor claims batches of pending tasks (weighted or strict across its queues),
    runs them on `concurrency` threads, and settles their outcomes in batches.

    Idle, it waits on a pub/sub wake-up that the broker publishes when a queue's pending set
    goes from empty to non-empty, so a new task starts within a round trip or two, or for a
    task the broker hands to it at enqueue.

    Its `concurrency + 1` threads take turns as the fetcher: the one that is handed a task
    while the others idle runs it itself, and an idle thread takes over fetching. The task
    then starts without waking another thread first.

    Its roles share one job table (`jobs`), which holds the one lock: the `fetcher`, the
    `executor` threads, the `watchdog` and the `settler`.
    """

    def __init__(
        self,
        *,
        broker: Broker,
        worker_id: str,
        queues: dict[str, int],
        concurrency: int,
        syncer: Syncer,
        strict: bool = False,
        idle_wait: float = 1.0,
        burst: bool = False,
    ) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.queues = dict(queues)
        self.concurrency = concurrency
        self.strict = strict
        self.started_at = broker.clock()  # the queue's clock, as the times of its tasks
        #: How long (seconds) a lease is relied on after the request that set it was sent.
        self.lease_budget = lease_budget(broker.lease_ms)

        self.jobs = JobTable(clock=lambda: broker.clock())
        self.fetcher = Fetcher(
            jobs=self.jobs,
            broker=broker,
            worker_id=worker_id,
            queues=self.queues,
            concurrency=concurrency,
            lease_budget=self.lease_budget,
            strict=strict,
            idle_wait=idle_wait,
            burst=burst,
        )
        self.jobs.room_wanted = self.fetcher.should_claim
        self.executor = Executor(jobs=self.jobs, fetcher=self.fetcher, worker_id=worker_id)
        self.watchdog = Watchdog(jobs=self.jobs, executor=self.executor, lease_budget=self.lease_budget)
        self.settler = Settler(jobs=self.jobs, broker=broker, worker_id=worker_id, syncer=syncer)
        #: Set when a burst worker found its queues drained.
        self.drained: threading.Event = self.fetcher.drained

    # Lifecycle

    def start(self) -> None:
        self.fetcher.subscribe()
        self.executor.start(self.concurrency + 1)  # one of them fetches at any time
        self.settler.start()
        self.watchdog.start()
        self.fetcher.start()

    def stop(self, timeout: float) -> None:
        """Stop claiming, give back the tasks that have not started, let running tasks finish
        for up to `timeout` seconds, then stop those still running and give them back too.

        A task is given back only once its handler has stopped, so no other worker can run
        it while it still runs here. A handler that ignores the interruption (stuck in C code)
        keeps its task: the lease runs out after this process exits, and the recoverer gives
        the task to another worker then.
        """
        self.jobs.stopping.set()
        self.fetcher.wait_until_stopped()
        waiting = self.jobs.abandon_queued()
        give_back(self.broker, self.worker_id, ids_by_queue(waiting), "that had not started")
        stopped, stuck = self.watchdog.stop_handlers(timeout)
        give_back(self.broker, self.worker_id, ids_by_queue(stopped), "stopped by the shutdown")
        for job in stuck:
            logger.error(
                "task %r (%s) of queue %r did not stop; its lease will run out once this worker "
                "exits, and another worker will run it then",
                job.id,
                job.message.task,
                job.claimed.queue,
            )
        self.executor.end_threads()
        self.jobs.outcomes.put(None)
        self.settler.thread.join()
        self.watchdog.thread.join()

    # What the heartbeater, the subscriber and the server ask of the processor

    def stop_claiming(self) -> None:
        """Claim no more, and give back at once the tasks claimed that have not started; those
        running go on (a worker about to be recycled: then stop() finds little left to do)."""
        with self.jobs.cond:  # a claim under way dispatches before this, or gives its tasks back
            self.fetcher.claims_left = 0
            waiting = self.jobs.abandon_queued()
        give_back(self.broker, self.worker_id, ids_by_queue(waiting), "that had not started")

    @property
    def capacity(self) -> int:
        """How many claimed tasks not yet finished the worker may hold (see Fetcher.capacity)."""
        return self.fetcher.capacity

    @property
    def busy(self) -> bool:
        """Whether tasks are running or waiting for a thread, or were a moment ago."""
        return self.jobs.busy

    @property
    def on_commands(self) -> Callable[[], None]:
        """Called after settling outcomes that wrote workflow commands (set by the server)."""
        return self.settler.on_commands

    @on_commands.setter
    def on_commands(self, callback: Callable[[], None]) -> None:
        self.settler.on_commands = callback

    def owned_by_queue(self) -> dict[str, list[tuple[str, bool]]]:
        """The tasks whose leases this worker holds, by queue, each with whether it has started."""
        return self.jobs.owned_by_queue()

    def lease_extended(self, sent_at: float) -> None:
        """Note that the leases were renewed by a request sent at `sent_at` (time.monotonic())."""
        self.watchdog.lease_extended(sent_at)

    def queue_order(self) -> list[str]:
        """Strict: by weight, highest first. Weighted: a random order, heavier queues likelier first."""
        return self.fetcher.queue_order()

    def cancel(self, task_id: str) -> bool:
        """Stop a task this worker holds: skip it if it has not started, interrupt it if it runs."""
        return self.watchdog.cancel(task_id)

    def dead_threads(self) -> list[str]:
        """Names of the processor's own threads that died although it is not stopping."""
        if self.jobs.stopping.is_set():
            return []
        own = (self.settler.thread, self.watchdog.thread)
        dead = [thread.name for thread in own if not thread.is_alive()]
        fetching = self.fetcher.thread
        if fetching is not None and not fetching.is_alive():
            dead.append(f"{fetching.name} (fetching)")
        return dead

    def describe(self) -> dict[str, Any]:
        running = [
            {
                "id": job.id,
                "task": job.message.task,
                "queue": job.claimed.queue,
                "started_at": job.started_at,
            }
            for job in self.jobs.running_jobs()
        ]
        return {
            "id": self.worker_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "strict": self.strict,
            "concurrency": self.concurrency,
            "started_at": self.started_at,
            "active": running,
        }

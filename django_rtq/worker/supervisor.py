"""The supervisor runs worker processes (for several cores, or to recycle them) and replaces any that ends."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from django.db import connections

from .health import ChildBeats, HealthFile, SlotBeat
from .processor.watchdog import SHUTDOWN_STOP_GRACE
from .server import EXIT_GRACE_SECONDS, EXIT_RECYCLED, EXIT_REDIS_UNREACHABLE

logger = logging.getLogger(__name__)

#: Seconds between looks at the children.
POLL_SECONDS = 0.5
#: Seconds to wait before restarting a child that died.
RESTART_DELAY_SECONDS = 1.0
#: A child that has not beaten for this many health intervals (at least MIN_STALE_SECONDS)
#: is stuck: the supervisor stops rewriting the health file.
STALE_INTERVALS = 2
MIN_STALE_SECONDS = 2.0


def _child_main(worker_options: dict[str, Any], supervisor_pid: int, health: SlotBeat | None) -> None:
    from .server import Worker, exit_in_time

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor alone turns Ctrl-C into SIGTERMs
    worker = Worker(**worker_options, health=health)
    threading.Thread(target=_stop_when_orphaned, args=(worker, supervisor_pid), daemon=True).start()
    status = worker.run()
    exit_in_time(status)  # whatever threads its handlers left running
    sys.exit(status)


def _stop_when_orphaned(worker: Any, supervisor_pid: int) -> None:
    """Shut the worker down gracefully if the supervisor dies without telling it (SIGKILL)."""
    while os.getppid() == supervisor_pid:
        time.sleep(POLL_SECONDS)
    logger.warning("supervisor %s is gone; worker process %s stops", supervisor_pid, os.getpid())
    worker.request_stop()


class Supervisor:
    """The supervisor forks `processes` workers, restarts those that die unasked, replaces at
    once those that were recycled (EXIT_RECYCLED), and on SIGTERM/SIGINT passes SIGTERM on to
    each and waits for their graceful shutdown.

    With `health_file`, it alone writes that file, for all its children: every
    `health_interval` seconds while each child beats (every child's threads are alive and its
    main loop turns), ready while no child has seen Redis fail to answer and one has seen it
    answer. A child being replaced counts as fresh for a while: replacing one is no failure.
    """

    def __init__(
        self,
        *,
        processes: int,
        worker_options: dict[str, Any],
        shutdown_timeout: float,
        health_file: str | None = None,
        health_interval: float = 15.0,
    ) -> None:
        self.processes = processes
        self.worker_options = worker_options
        self.shutdown_timeout = shutdown_timeout
        self._context = multiprocessing.get_context("fork")
        self._children: list[multiprocessing.Process] = []
        self._stop = threading.Event()
        self.health = HealthFile(health_file, health_interval) if health_file else None
        self.beats = ChildBeats(self._context, processes) if health_file else None
        self.stale_after = max(STALE_INTERVALS * health_interval, MIN_STALE_SECONDS)
        self._stale_said = False

    def _spawn(self, slot: int) -> multiprocessing.Process:
        connections.close_all()  # a forked child must open its own database connections
        health = None
        if self.beats is not None:
            self.beats.reset(slot)
            health = self.beats.slot(slot)
        child = self._context.Process(
            target=_child_main, args=(self.worker_options, os.getpid(), health), name="rtq-worker"
        )
        child.start()
        logger.info("started worker process %s", child.pid)
        return child

    def _beat(self) -> None:
        """Rewrite the health file if every child beat of late."""
        if self.health is None or self.beats is None:
            return
        children = []
        for slot, child in enumerate(self._children):
            age, ready = self.beats.read(slot)
            if age > self.stale_after:
                if not self._stale_said:
                    logger.error(
                        "worker process %s has not told it is alive for %.0fs: the health file %s is "
                        "no longer rewritten",
                        child.pid,
                        age,
                        self.health.path,
                    )
                self._stale_said = True
                return
            children.append({"pid": child.pid, "ready": ready, "beat_age": round(age, 3)})
        self._stale_said = False
        ready = any(child["ready"] for child in children) and all(
            child["ready"] is not False for child in children
        )
        self.health.beat(ready, processes=children)

    def request_stop(self, *_: Any) -> None:
        self._stop.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self._children = [self._spawn(slot) for slot in range(self.processes)]
        burst = self.worker_options.get("burst", False)
        status = 0
        while not self._stop.wait(POLL_SECONDS):
            for i, child in enumerate(self._children):
                if child.is_alive():
                    continue
                if burst and child.exitcode in (0, EXIT_REDIS_UNREACHABLE):
                    continue  # done, or gave up on Redis: starting it again would not help
                if child.exitcode == EXIT_RECYCLED:
                    logger.info("worker process %s was recycled; starting its replacement", child.pid)
                    self._children[i] = self._spawn(i)
                    continue
                logger.error(
                    "worker process %s exited with code %s; restarting it",
                    child.pid,
                    child.exitcode,
                )
                if self._stop.wait(RESTART_DELAY_SECONDS):
                    break
                self._children[i] = self._spawn(i)
            if burst and not any(child.is_alive() for child in self._children):
                status = max(child.exitcode or 0 for child in self._children)
                break
            self._beat()
        for child in self._children:
            if child.is_alive():
                child.terminate()  # SIGTERM: a graceful shutdown
        for child in self._children:
            # its own graceful budget: the shutdown timeout, the handlers' stop, the exit's grace
            child.join(self.shutdown_timeout + SHUTDOWN_STOP_GRACE + EXIT_GRACE_SECONDS)
            if child.is_alive():
                logger.error("worker process %s did not stop in time; killing it", child.pid)
                child.kill()
                child.join()
        if self.health is not None:
            self.health.remove()
        return status

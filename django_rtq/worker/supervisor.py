"""The supervisor runs several worker processes (for several cores) and restarts any that dies."""

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

from .server import EXIT_REDIS_UNREACHABLE

logger = logging.getLogger(__name__)

#: Seconds between looks at the children.
POLL_SECONDS = 0.5
#: Seconds to wait before restarting a child that died.
RESTART_DELAY_SECONDS = 1.0


def _child_main(worker_options: dict[str, Any], supervisor_pid: int) -> None:
    from .server import Worker, exit_in_time

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor alone turns Ctrl-C into SIGTERMs
    worker = Worker(**worker_options)
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
    """The supervisor forks `processes` workers, restarts those that die unasked, and on
    SIGTERM/SIGINT passes SIGTERM on to each and waits for their graceful shutdown."""

    def __init__(self, *, processes: int, worker_options: dict[str, Any], shutdown_timeout: float) -> None:
        self.processes = processes
        self.worker_options = worker_options
        self.shutdown_timeout = shutdown_timeout
        self._context = multiprocessing.get_context("fork")
        self._children: list[multiprocessing.Process] = []
        self._stop = threading.Event()

    def _spawn(self) -> multiprocessing.Process:
        connections.close_all()  # a forked child must open its own database connections
        child = self._context.Process(
            target=_child_main, args=(self.worker_options, os.getpid()), name="rtq-worker"
        )
        child.start()
        logger.info("started worker process %s", child.pid)
        return child

    def request_stop(self, *_: Any) -> None:
        self._stop.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self._children = [self._spawn() for _ in range(self.processes)]
        burst = self.worker_options.get("burst", False)
        while not self._stop.wait(POLL_SECONDS):
            for i, child in enumerate(self._children):
                if child.is_alive():
                    continue
                if burst and child.exitcode in (0, EXIT_REDIS_UNREACHABLE):
                    continue  # done, or gave up on Redis: starting it again would not help
                logger.error(
                    "worker process %s exited with code %s; restarting it",
                    child.pid,
                    child.exitcode,
                )
                if self._stop.wait(RESTART_DELAY_SECONDS):
                    break
                self._children[i] = self._spawn()
            if burst and not any(child.is_alive() for child in self._children):
                return max(child.exitcode or 0 for child in self._children)
        for child in self._children:
            if child.is_alive():
                child.terminate()  # SIGTERM: a graceful shutdown
        for child in self._children:
            child.join(self.shutdown_timeout + 5)
            if child.is_alive():
                logger.error("worker process %s did not stop in time; killing it", child.pid)
                child.kill()
                child.join()
        return 0

"""Real `rtq_worker` processes on the test's key prefix, stopped after the test."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.support import ROOT


@pytest.fixture
def start_worker(broker, prefix) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start real `rtq_worker` processes on the test's key prefix: `start_worker(*args, lease=, **env)`."""
    processes = []

    def start(*args: str, lease: float = 30, **env: str) -> subprocess.Popen:
        environment = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "RTQ_TEST_PREFIX": prefix,
            "RTQ_TEST_LEASE": str(lease),
            **env,
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "django", "rtq_worker", "--loglevel", "WARNING", *args],
            env=environment,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


class OutputLines:
    """The lines a process writes on its stdout (a pipe), read as they come by a thread of
    their own, so that a test can wait for a line while the process runs."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))

    def having(self, text: str) -> list[str]:
        """The lines read so far that contain `text`."""
        return [line for line in list(self.lines) if text in line]

    def text(self) -> str:
        return "\n".join(self.lines)

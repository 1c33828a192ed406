"""Real `rtq_worker` processes on the test's key prefix, stopped after the test."""

from __future__ import annotations

import os
import subprocess
import sys
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

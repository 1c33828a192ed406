"""A plain Django project that knows only `django.tasks` runs its tasks under
`rtq_worker --burst` and reads their results (each step a process of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import RedisProcess

PROJECT = Path(__file__).parent / "plainproject"


@pytest.fixture
def project(tmp_path):
    server = RedisProcess().start()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "plainsite.settings",
        "PYTHONPATH": str(PROJECT),
        "PLAIN_DATABASE": str(tmp_path / "plain.sqlite3"),
        "RTQ_REDIS_URL": server.url,
    }
    env.pop("RTQ_TEST_PREFIX", None)

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    try:
        yield run
    finally:
        server.stop()


def test_a_django_tasks_project_runs_under_rtq_worker(project):
    project("-m", "django", "migrate", "--verbosity", "0")
    ids = json.loads(project("-m", "shop.client", "enqueue"))
    before = json.loads(project("-m", "shop.client", "results", *ids))
    assert [r["status"] for r in before] == ["READY", "READY", "READY"]

    project("-m", "django", "rtq_worker", "--burst", "--loglevel", "warning")

    total, attempt, broken = json.loads(project("-m", "shop.client", "results", *ids))
    assert total == {"status": "SUCCESSFUL", "value": 6.5, "errors": [], "attempts": 1, "finished": True}
    assert attempt == {"status": "SUCCESSFUL", "value": 1, "errors": [], "attempts": 1, "finished": True}
    assert broken == {
        "status": "FAILED",
        "value": None,
        "errors": ["builtins.LookupError"],
        "attempts": 1,
        "finished": True,
    }

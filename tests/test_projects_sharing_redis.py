"""Two Django projects on one Redis and key prefix are told apart: each worker's info carries
its project's fingerprint, a worker warns once of another project's workers, and
`manage.py check --deploy` does too (W009). Workers of "another project" are real `rtq_worker`
processes with a SECRET_KEY of their own."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket

import pytest
from django.core.checks import run_checks

from django_rtq.checks import REDIS_TAG
from django_rtq.projects import FINGERPRINT_LENGTH, current_project
from django_rtq.worker import neighbours
from tests.support.polling import wait_for

OTHER_KEY = "another-project-entirely"


def deploy_warnings() -> list[str]:
    messages = run_checks(tags=[REDIS_TAG], include_deployment_checks=True)
    return [m.msg for m in messages if m.id == "django_rtq.W009"]


def live_worker_of(inspector, process) -> dict:
    """The info of a worker process once it is registered."""

    def registered():
        infos = inspector.worker_infos(inspector.live_worker_ids()).values()
        return next((info for info in infos if info.get("pid") == process.pid), None)

    return wait_for(registered, timeout=20, message=f"worker pid {process.pid} registered")


def sharing_warnings(caplog) -> list[str]:
    records = caplog.records
    return [r.getMessage() for r in records if r.name == neighbours.__name__ and r.levelno == logging.WARNING]


@pytest.fixture
def watching(monkeypatch, caplog):
    """In-process workers look at the registry at every beat, and their warnings are captured."""
    monkeypatch.setattr(neighbours, "WATCH_INTERVAL", 0.0)
    caplog.set_level(logging.WARNING, logger="django_rtq")


def test_the_fingerprint_stays_with_a_project_and_reveals_nothing(settings, monkeypatch):
    project = current_project()
    assert project == current_project()
    assert len(project.fingerprint) == FINGERPRINT_LENGTH and int(project.fingerprint, 16) >= 0
    info = json.dumps(project.info())
    assert settings.SECRET_KEY not in info
    assert project.info() == {"project": project.fingerprint, "settings": "tests.settings"}

    settings.SECRET_KEY = OTHER_KEY
    assert current_project().fingerprint != project.fingerprint
    assert current_project().runs(project.info()) is False
    settings.SECRET_KEY = "tests-only"
    assert current_project().fingerprint == project.fingerprint
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "another.settings")  # as override_settings leaves it
    assert current_project().runs(project.info()) is False


def test_a_rotated_secret_key_in_the_fallbacks_keeps_the_releases_one_project(settings):
    old_release = current_project()
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "the-new-key", [settings.SECRET_KEY]
    new_release = current_project()
    assert new_release.fingerprint != old_release.fingerprint
    assert new_release.info()["project_fallbacks"] == [old_release.fingerprint]
    assert old_release.runs(new_release.info()) is True
    assert new_release.runs(old_release.info()) is True
    assert new_release.runs({"id": "a worker of 0.1.0", "host": "h", "pid": 1}) is None


def test_a_worker_of_another_project_is_warned_of_once_by_each_side_and_by_check_deploy(
    broker, inspector, run_worker, start_worker, watching, caplog
):
    with run_worker() as here:
        wait_for(lambda: here.id in inspector.live_worker_ids(), message="this worker registered")
        other = start_worker(RTQ_TEST_SECRET_KEY=OTHER_KEY)
        other_info = live_worker_of(inspector, other)
        assert other_info["settings"] == "tests.settings"
        assert other_info["project"] != current_project().fingerprint

        (warning,) = wait_for(lambda: sharing_warnings(caplog), timeout=10)
        assert f"settings 'tests.settings': {other_info['host']} pid {other.pid})" in warning
        assert f"key prefix {broker.keys.prefix!r}" in warning
        assert "kept apart" in warning and "the admin are shared" in warning
        assert "RTQ['KEY_PREFIX']" in warning

        # A second worker of that project: seen, but the project was told of already.
        second = start_worker(RTQ_TEST_SECRET_KEY=OTHER_KEY)
        second_info = live_worker_of(inspector, second)
        wait_for(lambda: second_info["id"] in here.heartbeater.neighbours.seen, timeout=10)
        assert len(sharing_warnings(caplog)) == 1

        (deploy_warning,) = deploy_warnings()
        assert f"pid {other.pid}" in deploy_warning and f"pid {second.pid}" in deploy_warning

        # The other side warned of this worker when it started.
        other.send_signal(signal.SIGTERM)
        output, _ = other.communicate(timeout=30)
        assert f"settings 'tests.settings': {socket.gethostname()} pid {os.getpid()})" in output
        assert output.count("Workers of another Django project") == 1


def test_workers_of_one_project_are_not_warned_of(inspector, run_worker, start_worker, watching, caplog):
    with run_worker() as here:
        release = start_worker()
        info = live_worker_of(inspector, release)
        assert info["project"] == current_project().fingerprint
        wait_for(lambda: info["id"] in here.heartbeater.neighbours.seen, timeout=10)
        assert sharing_warnings(caplog) == []
        assert deploy_warnings() == []
        release.send_signal(signal.SIGTERM)
        output, _ = release.communicate(timeout=30)
        assert "another Django project" not in output


def test_a_worker_of_0_1_0_without_a_project_is_not_taken_for_another(broker, inspector, watching, caplog):
    old_info = {"id": "old:1:abc", "host": "old", "pid": 1, "queues": {"default": 1}}  # no project
    broker.write_worker("old:1:abc", old_info, ttl_seconds=30)
    watch = neighbours.NeighbourWatch(broker=broker, worker_id="me", project=current_project())
    watch.look()
    assert watch.seen == {"me", "old:1:abc"}
    assert sharing_warnings(caplog) == []
    assert deploy_warnings() == []

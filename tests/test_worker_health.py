"""The health file of real `rtq_worker` processes and `python -m django_rtq.probe live|ready`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from django_rtq.worker.server import EXIT_THREAD_DIED
from tests.support import ROOT
from tests.support.polling import wait_for
from tests.support.servers import RedisProcess
from tests.testapp import tasks


def probe(kind: str, path, *extra: str) -> tuple[int, str]:
    """Run the probe as a kubelet would: a fresh Python process; its status and its one line."""
    done = subprocess.run(
        [sys.executable, "-m", "django_rtq.probe", kind, "--file", str(path), *extra],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout.strip()


def passes(kind: str, path, *extra: str) -> bool:
    return probe(kind, path, *extra)[0] == 0


def fails(kind: str, path, *extra: str) -> str | None:
    status, line = probe(kind, path, *extra)
    return line if status == 1 else None


def test_a_healthy_worker_passes_both_probes_and_its_file_goes_when_it_stops(start_worker, tmp_path):
    health = tmp_path / "health.json"
    worker = start_worker("--health-file", str(health))
    wait_for(lambda: passes("ready", health), timeout=20, message="the worker to be ready")

    status, line = probe("live", health)
    assert status == 0 and line.startswith(f"live: worker pid {worker.pid}, health file written ")
    status, line = probe("ready", health)
    assert status == 0 and line.startswith(f"ready: worker pid {worker.pid}")
    data = json.loads(health.read_text())
    assert data["pid"] == worker.pid and data["ready"] is True and data["interval"] == 0.5
    assert abs(data["written_at"] - time.time()) < 5
    assert not list(tmp_path.glob(".rtq-health-*"))  # written through a temporary file, renamed

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    line = fails("live", health)
    assert line and line.startswith(f"not live: no health file at {health}")


def test_a_stopped_worker_goes_stale_and_fails_live_until_it_runs_again(start_worker, tmp_path):
    health = tmp_path / "health.json"
    worker = start_worker("--health-file", str(health))
    wait_for(lambda: passes("live", health), timeout=20, message="the worker to be live")

    os.kill(worker.pid, signal.SIGSTOP)  # stuck: none of its threads runs
    try:
        # The default max age is 3 intervals (tests/settings.py: HEALTHCHECK_INTERVAL 0.5).
        line = wait_for(lambda: fails("live", health), timeout=10, message="live to fail")
        assert "last wrote its health file" in line and "(max age 1.5s)" in line
        assert fails("ready", health).startswith("not ready: ")
        assert passes("live", health, "--max-age", "3600")  # the age alone failed it
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    wait_for(lambda: passes("live", health), timeout=10, message="live again once it runs")


def test_a_worker_whose_thread_died_fails_live(start_worker, tmp_path, redis_client):
    health = tmp_path / "health.json"
    worker = start_worker("--health-file", str(health))
    wait_for(lambda: passes("live", health), timeout=20, message="the worker to be live")

    tasks.kills_a_worker_thread.enqueue("killer", "rtq-janitor")
    assert worker.wait(timeout=30) == EXIT_THREAD_DIED
    assert redis_client.lrange(tasks.report_key("killer"), 0, -1) == [str(worker.pid)]
    assert "rtq-janitor died" in worker.stdout.read()
    line = fails("live", health)
    assert line and line.startswith("not live: no health file")


def test_a_worker_whose_redis_died_fails_ready_but_stays_live(start_worker, tmp_path):
    server = RedisProcess().start()
    try:
        health = tmp_path / "health.json"
        start_worker("--health-file", str(health), RTQ_REDIS_URL=server.url)
        wait_for(lambda: passes("ready", health), timeout=20, message="the worker to be ready")

        server.stop()
        line = wait_for(lambda: fails("ready", health), timeout=30, message="ready to fail")
        assert line.startswith("not ready: Redis did not answer worker pid")
        assert passes("live", health)  # nothing to restart it for: it waits for Redis
    finally:
        server.stop()


def test_a_missing_file_fails_both_probes_with_a_clear_line(tmp_path):
    missing = tmp_path / "nowhere.json"
    for kind in ("live", "ready"):
        status, line = probe(kind, missing)
        assert status == 1
        assert line == (
            f"not {kind}: no health file at {missing} (the worker is not running, has not started yet, "
            "or was not given --health-file)"
        )


def test_the_probe_imports_no_django(tmp_path):
    health = tmp_path / "health.json"
    health.write_text(json.dumps({"pid": 1, "written_at": time.time(), "ready": True, "interval": 15}))
    code = (
        "import sys; from django_rtq import probe; status = probe.main(['ready', '--file', sys.argv[1]]); "
        "print(sorted(name for name in sys.modules if name.startswith('django'))); sys.exit(status)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(health)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    ready, modules = done.stdout.splitlines()
    assert ready.startswith("ready: worker pid 1, health file written")
    assert modules == "['django_rtq', 'django_rtq.probe']"


def test_a_supervisor_writes_one_file_for_its_processes_and_fails_live_if_one_is_stuck(
    start_worker, tmp_path
):
    health = tmp_path / "health.json"
    supervisor = start_worker("--processes", "2", "--health-file", str(health))

    def children() -> list[int]:
        data = json.loads(health.read_text())
        return len(data["processes"]) == 2 and [child["pid"] for child in data["processes"]]

    pids = wait_for(children, timeout=20, ignoring=(OSError, ValueError), message="both processes")
    wait_for(lambda: passes("ready", health), timeout=20, message="the supervisor to be ready")
    assert json.loads(health.read_text())["pid"] == supervisor.pid

    stuck = pids[0]
    os.kill(stuck, signal.SIGSTOP)
    try:
        line = wait_for(lambda: fails("live", health), timeout=15, message="live to fail")
        assert f"worker pid {supervisor.pid} last wrote its health file" in line
    finally:
        os.kill(stuck, signal.SIGKILL)  # a stopped process ends at SIGKILL; the supervisor replaces it
    wait_for(lambda: passes("live", health), timeout=20, message="live again after the replacement")
    assert stuck not in children()
    assert supervisor.poll() is None

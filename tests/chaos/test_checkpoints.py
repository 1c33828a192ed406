"""A backfill over 2,000 rows with checkpoints (`iterate_queryset`) in real `rtq_worker`
processes: SIGTERM mid-task stops it at its next checkpoint, at once, and SIGKILL loses at most
the batch under way; the next run resumes from the last checkpoint, no attempt is charged, and
the rows handled twice are counted and reported."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest

from tests.chaos.harness import LEDGER, Chaos, report
from tests.support.polling import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

ROWS = 2000
BATCH = 100
ROW_MS = 4  # a run of the whole backfill: about 8 s, a batch about 0.4 s
#: Rows handled before the fault, at least: the task is well under way (for SIGKILL, mid-batch).
HANDLED_AT_FAULT = 600
KILLED_AT = 650
#: A shutdown timeout far beyond a batch: a worker out sooner stopped the task at its checkpoint.
SHUTDOWN_TIMEOUT = 60


def start_backfill(chaos: Chaos, key: str) -> str:
    """Make ROWS orders and enqueue the backfill over them; return its task id."""
    code = (
        "from chaosapp.models import Order; from chaosapp.tasks import chaos_backfill; "
        f"Order.objects.bulk_create([Order(key=f'o{{n}}') for n in range({ROWS})]); "
        f"print(chaos_backfill.enqueue({key!r}, {BATCH}, {ROW_MS}).id)"
    )
    return chaos.manage("shell", "-c", code).strip().splitlines()[-1]


def handled(chaos: Chaos, key: str) -> list[int]:
    return [int(pk) for pk in chaos.client.lrange(f"{LEDGER}:{key}:done", 0, -1)]


def runs(chaos: Chaos, key: str) -> list[dict]:
    return [json.loads(line) for line in chaos.client.lrange(f"{LEDGER}:{key}:runs", 0, -1)]


def finished(chaos: Chaos, task_id: str) -> bool:
    return chaos.client.hget(chaos.keys.state, task_id) is None


def check_resumed(chaos: Chaos, key: str, task_id: str) -> tuple[int, list[dict]]:
    """Wait until the backfill finished; check every row was handled and no attempt charged;
    return how many rows were handled twice, and the runs."""
    wait_for(lambda: finished(chaos, task_id), timeout=90, message="the backfill to finish", interval=0.1)
    done = handled(chaos, key)
    assert set(done) == set(range(1, ROWS + 1)), "a row was never handled"
    ran = runs(chaos, key)
    assert len(ran) == 2, ran
    assert [(run["retried"], run["errors"]) for run in ran] == [(0, 0), (0, 0)], ran
    twice = sum(count - 1 for count in Counter(done).values())
    return twice, ran


def test_sigterm_stops_a_backfill_at_its_next_checkpoint(redis_servers, chaos_project):
    chaos = chaos_project(redis_servers().url)
    task_id = start_backfill(chaos, "sigterm")
    worker = chaos.start_worker("--shutdown-timeout", str(SHUTDOWN_TIMEOUT), name="first")
    wait_for(lambda: len(handled(chaos, "sigterm")) >= HANDLED_AT_FAULT, timeout=60, interval=0.02)
    at_fault = len(handled(chaos, "sigterm"))
    sent = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=SHUTDOWN_TIMEOUT) == 0, worker.tail()
    exit_seconds = time.monotonic() - sent
    stopped_after = len(handled(chaos, "sigterm"))
    assert chaos.client.hget(chaos.keys.state, task_id) == "pending", "the task was not given back"
    chaos.start_worker(name="second")
    twice, ran = check_resumed(chaos, "sigterm", task_id)
    assert ran[1]["checkpoint"] == stopped_after  # the stop came right after the checkpoint
    assert ran[1]["recovered"] == 0
    report(
        f"checkpoints / SIGTERM: {ROWS} rows in batches of {BATCH}; SIGTERM at {at_fault} rows handled, "
        f"worker out in {exit_seconds:.2f}s (shutdown timeout {SHUTDOWN_TIMEOUT}s), stopped at checkpoint "
        f"{stopped_after}; next run resumed after it; rows handled twice: {twice}; attempts charged: 0"
    )
    assert exit_seconds < 10, (
        f"the worker took {exit_seconds:.1f}s: it waited instead of stopping at a checkpoint"
    )
    assert twice == 0


def test_sigkill_resumes_a_backfill_from_its_last_checkpoint(redis_servers, chaos_project):
    chaos = chaos_project(redis_servers().url)
    task_id = start_backfill(chaos, "sigkill")
    worker = chaos.start_worker(name="first")
    wait_for(lambda: len(handled(chaos, "sigkill")) >= KILLED_AT, timeout=60, interval=0.005)
    dead_at = chaos.kill(worker.pid)
    at_kill = len(handled(chaos, "sigkill"))
    chaos.start_worker(name="second")
    twice, ran = check_resumed(chaos, "sigkill", task_id)
    resumed_in = ran[1]["at"] - dead_at
    assert ran[1]["recovered"] == 1  # taken back from the dead worker: a recovery, not a retry
    assert ran[1]["checkpoint"] is not None and at_kill - ran[1]["checkpoint"] <= BATCH
    report(
        f"checkpoints / SIGKILL: {ROWS} rows in batches of {BATCH}; SIGKILL at {at_kill} rows handled, "
        f"last checkpoint {ran[1]['checkpoint']}; next run {resumed_in:.1f}s after the kill (lease), "
        f"resumed after it; rows handled twice: {twice} (at most a batch); attempts charged: 0"
    )
    assert twice <= BATCH

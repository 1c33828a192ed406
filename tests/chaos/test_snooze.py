"""Snooze with real `rtq_worker` processes (docs/snooze.md): a handler answered 429 snoozes and
runs again with no attempt charged; with its type held, the type's other tasks wait for the hold
to end while the queue's other types run on."""

from __future__ import annotations

import time

import pytest

from tests.support.polling import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

API_CALL = "chaosapp.tasks.chaos_api_call"
SLEEP = "chaosapp.tasks.chaos_sleep"
#: Seconds the first call's snooze holds its type.
RETRY_AFTER = 2.0
#: How early (s) a run may seem to start against the hold's end: the host's clock against the
#: Redis server's (the same machine here), and the rounding of times to the ms.
CLOCK_SLACK = 0.01


def test_a_snoozed_task_runs_twice_with_no_attempt_charged_and_a_hold_makes_its_type_wait(
    redis_servers, chaos_project
):
    chaos = chaos_project(redis_servers().url)
    workers = [chaos.start_worker("--concurrency", "4", name=f"w{n}") for n in range(2)]

    # Snooze once, then succeed: claimed twice, ran to its end once, no attempt charged.
    chaos.call([("nap", API_CALL, ["nap", 0.5, False], {})], name="nap")
    assert chaos.wait_ran(["nap"], timeout=60), [worker.tail() for worker in workers]
    (nap,) = [facts for facts in chaos.ledger() if facts["key"] == "nap"]
    assert (nap["claims"], nap["retried"], nap["snoozed"]) == (2, 0, 1)

    # Hold the type: its calls enqueued during the hold start only once it ends; others run.
    chaos.call([("api-0", API_CALL, ["api-0", RETRY_AFTER, True], {})], name="first")
    holds = wait_for(lambda: chaos.client.hgetall(chaos.keys.holds), timeout=30, message="a hold")
    (until_ms,) = [int(until) for until in holds.values()]
    enqueued_at = time.time()
    later = [(f"api-{n}", API_CALL, [f"api-{n}", 0, False], {}) for n in range(1, 7)]
    others = [(f"other-{n}", SLEEP, [f"other-{n}", 10], {}) for n in range(4)]
    chaos.call([*later, *others], name="later")
    keys = ["api-0", *(key for key, *_ in later), *(key for key, *_ in others)]
    assert chaos.wait_ran(keys, timeout=60), [worker.tail() for worker in workers]
    assert enqueued_at < until_ms / 1000 - 1, "the calls came too late to test the hold"

    started = {run.key: run.start for run in chaos.runlog.refresh().runs}
    api_starts = [started[key] for key in ("api-0", *(key for key, *_ in later))]
    assert min(api_starts) >= until_ms / 1000 - CLOCK_SLACK, (api_starts, until_ms)
    assert max(started[key] for key, *_ in others) < until_ms / 1000  # other types did not wait
    ledger = {facts["key"]: facts for facts in chaos.ledger()}
    assert all(ledger[key]["retried"] == 0 for key in ("api-0", *(k for k, *_ in later)))
    assert (ledger["api-0"]["claims"], ledger["api-0"]["snoozed"]) == (2, 1)

    drained_at = chaos.wait_drained(timeout=30)
    assert chaos.client.hlen(chaos.keys.holds) == 0  # dropped by the first claim after it ended
    chaos.verify("snooze", "faults=none", last_fault=enqueued_at, drained_at=drained_at)

"""The workers prune the ORM mirror by themselves: rows older than MIRROR_MAX_AGE go, one worker
at a time, in bounded batches, through a database outage; `rtq_prune` does it by hand."""

from __future__ import annotations

import io
import logging
import re
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_rtq.broker import Broker
from django_rtq.models import FinishedTask
from django_rtq.worker.pruner import Pruner
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600.0


def rows(prefix: str, count: int, age: timedelta) -> list[str]:
    """Make `count` mirrored rows that finished `age` ago; return their ids."""
    finished_at = timezone.now() - age
    ids = [f"{prefix}-{i:03d}" for i in range(count)]
    FinishedTask.objects.bulk_create(
        FinishedTask(task_id=i, task_name="t", queue="q", status="succeeded", finished_at=finished_at)
        for i in ids
    )
    return ids


def kept() -> set[str]:
    return set(FinishedTask.objects.values_list("task_id", flat=True))


def pruner(broker: Broker, worker_id: str = "worker-a", **options) -> Pruner:
    options.setdefault("max_age", HOUR)
    options.setdefault("every", 60.0)
    return Pruner(broker=broker, worker_id=worker_id, **options)


def test_a_pass_deletes_the_rows_older_than_the_age_and_keeps_the_newer(mirroring, broker):
    rows("old", 25, timedelta(hours=2))
    new = rows("new", 3, timedelta(minutes=59))

    assert pruner(broker, batch_size=10).run_once() == 25

    assert kept() == set(new)


def test_one_worker_prunes_at_a_time_and_not_again_before_the_interval(mirroring, broker):
    rows("old", 5, timedelta(hours=2))
    first, second = pruner(broker, "worker-a", every=1.0), pruner(broker, "worker-b", every=1.0)

    assert first.run_once() == 5
    later = rows("later", 4, timedelta(hours=2))
    assert second.run_once() == 0  # worker-a's turn runs for a second
    assert first.run_once() == 0  # and worker-a waits for it to end too
    assert kept() == set(later)

    wait_for(lambda: second.run_once() == 4, timeout=5, message="worker-b's turn once worker-a's ended")
    assert kept() == set()


def test_each_statement_deletes_one_batch_at_most(mirroring, broker):
    rows("old", 25, timedelta(hours=2))

    with CaptureQueriesContext(connection) as queries:
        assert pruner(broker, batch_size=10).run_once() == 25

    deletes = [query["sql"] for query in queries if query["sql"].startswith("DELETE")]
    sizes = [len(re.search(r"IN \(([^)]*)\)", sql).group(1).split(",")) for sql in deletes]
    assert sizes == [10, 10, 5]


def test_a_pass_stops_at_its_time_budget_and_the_next_turn_goes_on(mirroring, broker):
    old = rows("old", 40, timedelta(hours=2))
    # Half its interval: 0.1 s, in which batches of one row, each followed by a rest, fit a few.
    hasty = pruner(broker, every=0.2, batch_size=1)

    deleted = hasty.run_once()

    assert 1 <= deleted < 10
    assert len(kept()) == len(old) - deleted
    wait_for(lambda: hasty.run_once() and not kept(), timeout=30, message="later turns to delete the rest")


def test_a_worker_prunes_at_start_and_not_when_the_age_is_none(mirroring, settings, broker, run_worker):
    settings.RTQ = {**settings.RTQ, "MIRROR_MAX_AGE": HOUR}
    rows("old", 3, timedelta(hours=2))
    new = rows("new", 2, timedelta(minutes=5))
    with run_worker():
        wait_for(lambda: kept() == set(new), message="the old rows pruned")

    settings.RTQ = {**settings.RTQ, "MIRROR_MAX_AGE": None}
    broker.client.delete(broker.keys.mirror_prune_turn)
    old = rows("again", 3, timedelta(days=400))
    with run_worker() as worker:
        assert worker.pruner is None
    assert kept() == {*new, *old}


def test_a_database_outage_during_a_pass_is_logged_and_the_worker_goes_on(
    mirroring, settings, broker, run_worker, database_outage, caplog
):
    settings.RTQ = {**settings.RTQ, "MIRROR_MAX_AGE": HOUR, "MIRROR_PRUNE_INTERVAL": 1.0}
    new = rows("new", 2, timedelta(minutes=5))
    old = rows("old", 3, timedelta(hours=2))
    caplog.set_level(logging.WARNING, logger="django_rtq.worker.pruner")
    database_outage.down()
    down = True
    try:
        with run_worker() as worker:
            wait_for(
                lambda: "could not prune" in caplog.text, timeout=30, message="a pass to fail on the outage"
            )
            assert worker.pruner.is_alive() and not worker.dead_threads()
            database_outage.up()
            down = False
            wait_for(lambda: kept() == set(new), timeout=30, message="a later turn to prune")
            assert worker.pruner.is_alive() and not worker.dead_threads()
    finally:
        if down:
            database_outage.up()
    assert not set(old) & kept()


def test_rtq_prune_needs_an_age_when_the_setting_is_none(settings, prefix):
    settings.RTQ = {**settings.RTQ, "MIRROR_MAX_AGE": None}
    rows("old", 3, timedelta(days=400))

    with pytest.raises(CommandError, match="--older-than"):
        call_command("rtq_prune")

    call_command("rtq_prune", "--older-than", "60", stdout=io.StringIO())
    assert kept() == set()

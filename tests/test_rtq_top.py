"""`manage.py rtq_top` on the real Redis: one frame, JSON frames, the live loop, and Redis away."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_rtq.broker import Broker, TaskState
from django_rtq.connection import reset_broker
from django_rtq.management.commands import rtq_top
from tests.support.clock import FakeClock
from tests.support.commands import table, worker_info
from tests.support.factories import BILLING, EMAILS, make_tasks


class Terminal(io.StringIO):
    """An output that says it is a terminal, as a shell's stdout does."""

    def isatty(self) -> bool:
        return True


def top(*args: str, stdout: io.StringIO | None = None) -> str:
    out = stdout or io.StringIO()
    call_command("rtq_top", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def sections(output: str) -> list[str]:
    """The parts of a frame between blank lines: heading, queues, workers."""
    return output.strip("\n").split("\n\n")


def populate(rtq: Broker) -> None:
    make_tasks(rtq, TaskState.COMPLETED, EMAILS, 3)
    make_tasks(rtq, TaskState.RETRY, EMAILS, 1)
    make_tasks(rtq, TaskState.PENDING, EMAILS, 2)
    make_tasks(rtq, TaskState.ACTIVE, BILLING, 1)
    rtq.pause(BILLING)
    running = [{"id": "t1", "task": "tests.noop", "queue": BILLING, "started_at": rtq.clock() - 1}]
    rtq.write_worker("w-1", worker_info(rtq, "w-1", "alpha", running), ttl_seconds=60)


def test_once_prints_one_frame_of_queues_and_workers(rtq: Broker, clock: FakeClock):
    populate(rtq)
    clock.advance(30)

    output = top("--once")

    assert "\x1b[" not in output  # not a terminal: no clearing
    heading, queues, workers = sections(output)
    assert heading.startswith("django-rtq  2023-11-14 22:13:50 UTC  4 queues, 1 live worker")
    rows = {row["QUEUE"]: row for row in table(queues)}
    assert rows[EMAILS] == {
        "QUEUE": EMAILS,
        "PAUSED": "no",
        "PENDING": "2",
        "ACTIVE": "0",
        "SCHEDULED": "0",
        "RETRY": "1",
        "ARCHIVED": "0",
        "COMPLETED": "3",
        "WAITING": "0",
        "PROCESSED TODAY": "4",
        "FAILED TODAY": "1",
        "OLDEST PENDING": "30s",
        "PER SECOND": "-",
    }
    assert (rows[BILLING]["PAUSED"], rows[BILLING]["ACTIVE"]) == ("yes", "1")
    assert set(rows) == {EMAILS, BILLING, "default", "low"}
    assert table(workers) == [
        {
            "WORKER": "w-1",
            "HOST": "alpha",
            "PID": "4242",
            "QUEUES": "emails:3,search:1",
            "CONCURRENCY": "10",
            "RUNNING": "1",
        }
    ]


def test_once_for_some_queues_and_without_workers(rtq: Broker):
    make_tasks(rtq, TaskState.PENDING, EMAILS, 1)

    _, queues, workers = sections(top(EMAILS, "--once"))

    assert [row["QUEUE"] for row in table(queues)] == [EMAILS]
    assert workers == "No live workers."
    with pytest.raises(CommandError, match="Unknown queue 'nope'"):
        top("nope", "--once")
    with pytest.raises(CommandError, match="--interval must be more than 0"):
        top("--once", "--interval", "0")


def test_json_prints_one_object_per_frame(rtq: Broker):
    populate(rtq)

    [line] = top("--once", "--json").splitlines()

    frame = json.loads(line)
    queues = {q["queue"]: q for q in frame["queues"]}
    assert (queues[EMAILS]["completed"], queues[EMAILS]["size"], queues[EMAILS]["per_second"]) == (3, 6, None)
    assert queues[BILLING]["paused"] is True
    assert [worker["id"] for worker in frame["workers"]] == ["w-1"]


def test_the_live_view_redraws_every_interval_with_the_rate_since_the_last_frame(
    rtq: Broker, clock: FakeClock, monkeypatch
):
    make_tasks(rtq, TaskState.COMPLETED, EMAILS, 1)
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:  # between the two frames: 4 tasks finish in 2 seconds
            make_tasks(rtq, TaskState.COMPLETED, EMAILS, 4)
            clock.advance(2)
        else:
            raise KeyboardInterrupt  # Ctrl-C: the command ends quietly

    monkeypatch.setattr(rtq_top.time, "sleep", sleep)
    terminal = Terminal()

    output = top("--interval", "2", stdout=terminal)

    assert pauses == [2.0, 2.0]
    frames = output.split(rtq_top.CLEAR_SCREEN)
    assert frames[0] == "" and len(frames) == 3  # each frame starts by clearing the screen
    first, second = ({row["QUEUE"]: row for row in table(sections(f)[1])} for f in frames[1:])
    assert (first[EMAILS]["PROCESSED TODAY"], first[EMAILS]["PER SECOND"]) == ("1", "-")
    assert (second[EMAILS]["PROCESSED TODAY"], second[EMAILS]["PER SECOND"]) == ("5", "2.0")
    assert second["default"]["PER SECOND"] == "0.0"
    assert sections(frames[2])[0].startswith("django-rtq  2023-11-14 22:13:22 UTC")


def test_the_live_view_rides_out_redis_being_away(prefix, settings, monkeypatch):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens there
    reset_broker()
    frames: list[Any] = []

    def sleep(seconds: float) -> None:
        frames.append(seconds)
        if len(frames) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(rtq_top.time, "sleep", sleep)
    try:
        output = top("--interval", "0.5")
        with pytest.raises(CommandError, match="Cannot reach Redis"):
            top("--once")
    finally:
        reset_broker()
    assert output.count("Cannot reach Redis") == 2


def test_no_rate_across_midnight_utc_when_the_daily_counter_starts_again():
    from django_rtq.broker.inspect import QueueStats

    def stats(processed: int) -> QueueStats:
        return QueueStats(
            queue="default",
            pending=0,
            active=0,
            scheduled=0,
            retry=0,
            archived=0,
            completed=0,
            waiting=0,
            processed_today=processed,
            failed_today=0,
            paused=False,
            oldest_pending_age=None,
        )

    midnight = 1_795_478_400.0  # 2026-11-24 00:00 UTC
    before = rtq_top.Snapshot(at=midnight - 1, queues=[stats(3)], workers=[])
    assert rtq_top.rate(stats(10), midnight + 1, before) is None  # not 3.5/s
    assert rtq_top.rate(stats(10), midnight - 0.5, before) == 14.0

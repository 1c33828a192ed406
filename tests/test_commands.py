"""The inspecting management commands (rtq_stats, rtq_tasks, rtq_run, ...) on the real Redis."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError

from django_rtq.broker import Broker, TaskState
from django_rtq.broker.states import ACTION_STATES, Action
from django_rtq.formats import format_duration
from django_rtq.management.base import OperationsCommand
from django_rtq.management.table import format_relative, format_time, render_fields, render_table, shorten
from django_rtq.operations import Operations
from tests.support.clock import START_TIME, FakeClock
from tests.support.commands import START, fields_of, run, table, worker_info
from tests.support.factories import (
    BILLING,
    EMAILS,
    SEARCH,
    WORKER,
    claim_ids,
    done,
    enqueue,
    fail,
    make_tasks,
    message,
)
from tests.support.reading import holds_columns, ids_in, next_message, state_of, subscribed

S = TaskState


def run_json(name: str, *args: str) -> Any:
    return json.loads(run(name, *args, "--json"))


def command_error(name: str, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        run(name, *args)
    return str(info.value)


# The table helpers


def test_render_table_aligns_columns_and_right_aligns_numbers():
    lines = render_table(
        ("QUEUE", "PENDING", "OLDEST", "PAUSED"),
        [("emails", 3, "5s", True), ("search-index", 120, None, False)],
    )

    assert lines == [
        "QUEUE         PENDING  OLDEST  PAUSED",
        "emails              3  5s      yes",
        "search-index      120  -       no",
    ]


def test_render_table_keeps_a_cell_on_one_line_and_styles_only_the_header():
    lines = render_table(("A", "B"), [("line one\nline two", None)], header_style=lambda text: f"<{text}>")

    assert lines == ["<A                  B>", "line one line two  -"]


def test_render_fields_aligns_values():
    assert render_fields([("queue", "emails"), ("max_retries", 3), ("deadline", None)]) == [
        "queue:        emails",
        "max_retries:  3",
        "deadline:     -",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0.4s"),
        (4.25, "4.2s"),
        (45, "45s"),
        (200, "3m 20s"),
        (7500, "2h 5m"),
        (3 * 86400 + 4 * 3600 + 59, "3d 4h"),
    ],
)
def test_format_duration(seconds: float, text: str):
    assert format_duration(seconds) == text


def test_times_are_shown_in_utc_with_how_far_they_are():
    assert format_time(START_TIME) == START
    assert format_relative(START_TIME + 90, START_TIME) == "2023-11-14 22:14:50 UTC (in 1m 30s)"
    assert format_relative(START_TIME - 5, START_TIME) == "2023-11-14 22:13:15 UTC (5.0s ago)"
    assert format_time(None) is None


def test_shorten_cuts_long_text_on_one_line():
    assert shorten("a\nb", 10) == "a b"
    assert shorten("x" * 20, 10) == "x" * 9 + "…"


# rtq_stats


def populate(broker: Broker) -> dict[TaskState, list[str]]:
    """Put tasks of EMAILS in every state; SEARCH gets one pending task."""
    sizes = {S.ACTIVE: 1, S.COMPLETED: 1, S.RETRY: 2, S.ARCHIVED: 1, S.SCHEDULED: 2, S.PENDING: 3}
    made = {state: make_tasks(broker, state, EMAILS, count=count) for state, count in sizes.items()}
    enqueue(broker, SEARCH)
    return made


@pytest.mark.django_db  # rtq_stats reads the outbox too
def test_stats_shows_a_row_per_queue(rtq: Broker, clock: FakeClock):
    populate(rtq)
    rtq.pause(EMAILS)
    clock.advance(125)

    rows = table(run("rtq_stats"))

    assert [row["QUEUE"] for row in rows] == ["default", EMAILS, "low", SEARCH]  # default, low: settings.RTQ
    assert rows[1] == {
        "QUEUE": EMAILS,
        "PAUSED": "yes",
        "PENDING": "3",
        "ACTIVE": "1",
        "SCHEDULED": "2",
        "RETRY": "2",
        "ARCHIVED": "1",
        "COMPLETED": "1",
        "WAITING": "0",
        "PROCESSED TODAY": "4",
        "FAILED TODAY": "3",
        "OLDEST PENDING": "2m 5s",
    }
    assert (rows[0]["PENDING"], rows[0]["OLDEST PENDING"], rows[2]["PAUSED"]) == ("0", "-", "no")


@pytest.mark.django_db  # rtq_stats reads the outbox too
def test_stats_as_json(rtq: Broker, clock: FakeClock):
    populate(rtq)
    clock.advance(10)

    data = run_json("rtq_stats", EMAILS)

    assert data == {
        "queues": [
            {
                "queue": EMAILS,
                "pending": 3,
                "active": 1,
                "scheduled": 2,
                "retry": 2,
                "archived": 1,
                "completed": 1,
                "processed_today": 4,
                "failed_today": 3,
                "paused": False,
                "oldest_pending_age": 10.0,
                "waiting": 0,
                "snoozed_today": 0,  # tests/test_snooze.py
                "size": 10,
                "limits": [],  # no flow-control limit, no use (tests/test_flow_control_surfaces.py)
                "waiting_for_worker": [],  # tests/test_waiting_for_worker_surfaces.py
            }
        ],
        "outbox": {"waiting": 0, "oldest": None, "oldest_age_seconds": None, "failing": 0},
    }


@pytest.mark.django_db  # rtq_stats reads the outbox too
def test_stats_history_shows_each_day(rtq: Broker, clock: FakeClock):
    make_tasks(rtq, S.RETRY, EMAILS)
    clock.advance(86400)
    make_tasks(rtq, S.COMPLETED, EMAILS, count=3)

    output = run("rtq_stats", EMAILS, "--history", "3")
    data = run_json("rtq_stats", EMAILS, "--history", "3")

    history_table = output.split("Queue 'emails', last 3 days (UTC):\n")[1]
    assert table(history_table) == [
        {"DAY": "2023-11-13", "PROCESSED": "0", "FAILED": "0", "FAILURE RATE": "-"},
        {"DAY": "2023-11-14", "PROCESSED": "1", "FAILED": "1", "FAILURE RATE": "100.0%"},
        {"DAY": "2023-11-15", "PROCESSED": "3", "FAILED": "0", "FAILURE RATE": "0.0%"},
    ]
    assert data["queues"][0]["history"] == [
        {"day": "2023-11-13", "processed": 0, "failed": 0},
        {"day": "2023-11-14", "processed": 1, "failed": 1},
        {"day": "2023-11-15", "processed": 3, "failed": 0},
    ]


def test_stats_refuses_an_unknown_queue_and_a_bad_history(rtq: Broker):
    enqueue(rtq, EMAILS)

    assert command_error("rtq_stats", "nope") == "Unknown queue 'nope'. Known queues: default, emails, low."
    assert command_error("rtq_stats", "--history", "0") == "--history must be at least 1 day."


# rtq_tasks


def test_tasks_lists_a_page_in_run_order(rtq: Broker):
    messages = [message(SEARCH, priority=p) for p in (0, 5, 0, -3, 5)]
    rtq.enqueue(messages)
    run_order = [messages[i].id for i in (1, 4, 0, 2, 3)]

    pages = [run("rtq_tasks", SEARCH, "pending", "--page-size", "2", "--page", str(n)) for n in (1, 2, 3)]

    assert [row["ID"] for page in pages for row in table(page)] == run_order
    assert table(pages[0])[0] == {
        "ID": run_order[0],
        "TASK": "tests.noop",
        "STATE": "pending",
        "RETRIED": "0",
        "LAST ERROR": "-",
    }
    assert pages[2].splitlines()[-1] == "Page 3 of 3 (5 pending tasks)."


def test_tasks_shows_the_next_run_and_last_error_of_retry_tasks(rtq: Broker, clock: FakeClock):
    [task_id] = enqueue(rtq, EMAILS, max_retries=3)
    claim_ids(rtq, EMAILS)
    error = "connection refused\nwhile sending " + "x" * 80
    fail(rtq, EMAILS, task_id, S.RETRY, retry_at_ms=clock.ms(90), info={"error": error, "retried": 1})

    [row] = table(run("rtq_tasks", EMAILS, "retry"))

    assert row == {
        "ID": task_id,
        "TASK": "tests.noop",
        "STATE": "retry",
        "RETRIED": "1",
        "LAST ERROR": shorten(error),
        "NEXT RUN": "2023-11-14 22:14:50 UTC (in 1m 30s)",
    }
    assert (
        row["LAST ERROR"].startswith("connection refused while sending xxx") and len(row["LAST ERROR"]) == 60
    )


def test_tasks_shows_the_lease_and_worker_of_active_tasks(rtq: Broker):
    [task_id] = make_tasks(rtq, S.ACTIVE, EMAILS)

    [row] = table(run("rtq_tasks", EMAILS, "active"))

    assert (row["ID"], row["LEASE EXPIRES"], row["WORKER"]) == (
        task_id,
        "2023-11-14 22:13:50 UTC (in 30s)",
        WORKER,
    )


def test_tasks_as_json(rtq: Broker, clock: FakeClock):
    ids = make_tasks(rtq, S.ARCHIVED, BILLING, count=3)

    data = run_json("rtq_tasks", BILLING, "archived", "--page-size", "2")

    assert {key: value for key, value in data.items() if key != "tasks"} == {
        "queue": BILLING,
        "state": "archived",
        "page": 1,
        "page_size": 2,
        "pages": 2,
        "total": 3,
    }
    # Newest first: archived at the same time, so by id, descending
    assert [task["id"] for task in data["tasks"]] == sorted(ids, reverse=True)[:2]
    assert data["tasks"][0]["archived_at"] == clock.now
    assert data["tasks"][0]["last_error"] == "boom"


def test_tasks_says_when_a_page_is_empty(rtq: Broker):
    enqueue(rtq, EMAILS, count=3)

    assert run("rtq_tasks", EMAILS, "pending", "--page", "4", "--page-size", "1") == (
        "No pending tasks on page 4 (of 3) in queue 'emails'.\n"
    )
    assert run("rtq_tasks", EMAILS, "retry") == "No retry tasks in queue 'emails'.\n"
    assert run_json("rtq_tasks", EMAILS, "retry")["tasks"] == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("nope", "pending"), "Unknown queue 'nope'. Known queues: default, emails, low."),
        (
            (EMAILS, "done"),
            "Unknown state 'done'. States: scheduled, pending, active, retry, archived, completed, waiting.",
        ),
        ((EMAILS, "pending", "--page", "0"), "--page must be at least 1."),
        ((EMAILS, "pending", "--page-size", "0"), "--page-size must be between 1 and 1000."),
    ],
)
def test_tasks_refuses_bad_arguments(rtq: Broker, args: tuple[str, ...], error: str):
    enqueue(rtq, EMAILS)

    assert command_error("rtq_tasks", *args) == error


# rtq_task


def failed_task(broker: Broker, clock: FakeClock) -> str:
    [task_id] = enqueue(broker, EMAILS, args=[1, "two"], kwargs={"to": "ada@example.com"}, max_retries=3)
    claim_ids(broker, EMAILS)
    info = {
        "retried": 1,
        "error_type": "builtins.ValueError",
        "error": "bad address",
        "traceback": 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad address\n',
        "started_at": clock.now,
        "failed_at": clock.now + 2,
        "worker": WORKER,
    }
    fail(broker, EMAILS, task_id, S.RETRY, retry_at_ms=clock.ms(60), info=info)
    return task_id


def test_task_shows_every_field(rtq: Broker, clock: FakeClock):
    task_id = failed_task(rtq, clock)

    output = run("rtq_task", task_id)

    assert output.splitlines()[0] == f"Task {task_id}"
    assert fields_of(output) == {
        "queue": EMAILS,
        "state": "retry",
        "task": "tests.noop",
        "args": '[1, "two"]',
        "kwargs": '{"to": "ada@example.com"}',
        "next run": "2023-11-14 22:14:20 UTC (in 1m 0s)",
        "retried": "1",
        "last error": "builtins.ValueError: bad address",
        "priority": "0",
        "max_retries": "3",
        "timeout": "-",
        "deadline": "-",
        "retention": "0s",
        "unique_key": "-",
        "unique_ttl": "-",
        "enqueued_at": START,
        "process_at": "-",
        "parent": "-",
        "parent_queue": "-",
        "position": "-",
        "trace": "-",
        "debounce": "-",
        "debounce_key": "-",
        "merged_enqueues": "0",
        "partition": "-",
        "partition_weight": "1",
        "started_at": START,
        "failed_at": "2023-11-14 22:13:22 UTC",
        "worker": WORKER,
    }
    assert output.splitlines()[-4:] == [
        "Traceback",
        "  Traceback (most recent call last):",
        '    File "x.py", line 1',
        "  ValueError: bad address",
    ]


def test_task_shows_the_result_of_a_completed_task(rtq: Broker):
    [task_id] = enqueue(rtq, BILLING, retention=60)
    claim_ids(rtq, BILLING)
    rtq.complete(BILLING, [done(task_id, retention=60, result={"total": 3})], worker_id=WORKER)

    output = run("rtq_task", task_id, "--queue", BILLING)

    assert fields_of(output)["result"] == '{"total": 3}'
    assert fields_of(output)["expires"] == "2023-11-14 22:14:20 UTC (in 1m 0s)"
    assert fields_of(output)["retention"] == "60s"


def test_task_as_json(rtq: Broker, clock: FakeClock):
    task_id = failed_task(rtq, clock)

    data = run_json("rtq_task", task_id, "--queue", EMAILS)

    assert data["options"]["max_retries"] == 3 and data["options"]["enqueued_at"] == START_TIME
    assert {key: data[key] for key in ("id", "queue", "state", "task", "args", "kwargs", "retried")} == {
        "id": task_id,
        "queue": EMAILS,
        "state": "retry",
        "task": "tests.noop",
        "args": [1, "two"],
        "kwargs": {"to": "ada@example.com"},
        "retried": 1,
    }
    assert (data["last_error"], data["error_type"], data["next_run_at"]) == (
        "bad address",
        "builtins.ValueError",
        START_TIME + 60,
    )
    assert data["traceback"].endswith("ValueError: bad address\n")
    assert data["info"]["failed_at"] == START_TIME + 2
    assert "raw_message" not in data


def test_task_with_a_corrupt_message(rtq: Broker):
    [task_id] = enqueue(rtq, EMAILS)
    rtq.client.hset(rtq.queue(EMAILS).msg, task_id, "not json")

    assert fields_of(run("rtq_task", task_id))["message"] == "(corrupt) not json"
    assert run_json("rtq_task", task_id)["raw_message"] == "not json"


def test_task_refuses_an_unknown_id(rtq: Broker):
    [task_id] = enqueue(rtq, EMAILS)

    assert command_error("rtq_task", "nope") == "Unknown task id: nope."
    assert (
        command_error("rtq_task", task_id, "--queue", "default")
        == f"Unknown task id in queue 'default': {task_id}."
    )
    assert command_error("rtq_task", task_id, "--queue", "nope").startswith("Unknown queue 'nope'.")


# rtq_run, rtq_archive, rtq_delete

ACTIONS = [
    # command, a state it applies to, where the tasks go (None: deleted), a state it refuses
    ("rtq_run", S.RETRY, S.PENDING, S.PENDING),
    ("rtq_archive", S.SCHEDULED, S.ARCHIVED, S.COMPLETED),
    ("rtq_delete", S.ARCHIVED, None, S.ACTIVE),
]
DONE = {"rtq_run": "moved to pending", "rtq_archive": "archived", "rtq_delete": "deleted"}


def assert_moved(broker: Broker, ids: list[str], target: TaskState | None, queue: str = EMAILS) -> None:
    if target is None:
        assert not any(holds_columns(broker, queue, task_id) for task_id in ids)
    else:
        assert set(ids) <= set(ids_in(broker, queue, target))


@pytest.mark.parametrize(("command", "state", "target", "refused"), ACTIONS)
def test_an_action_by_id_acts_on_tasks_of_any_queue(
    rtq: Broker, command: str, state: TaskState, target: TaskState | None, refused: TaskState
):
    ids = make_tasks(rtq, state, EMAILS, count=2) + make_tasks(rtq, state, SEARCH)

    output = run(command, *ids)

    assert output == f"3 tasks {DONE[command]}.\n"
    assert_moved(rtq, ids[:2], target)
    assert_moved(rtq, ids[2:], target, SEARCH)


@pytest.mark.parametrize(("command", "state", "target", "refused"), ACTIONS)
def test_an_action_by_id_skips_tasks_in_a_state_it_does_not_apply_to(
    rtq: Broker, command: str, state: TaskState, target: TaskState | None, refused: TaskState
):
    [movable] = make_tasks(rtq, state, EMAILS)
    [refused_id] = make_tasks(rtq, refused, EMAILS)  # after: making it pending first would get it claimed
    out = io.StringIO()

    action = command[4:]

    with pytest.raises(CommandError, match=rf"^1 task skipped: {action} does not apply to it\.$"):
        call_command(command, movable, refused_id, "--queue", EMAILS, stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0] == f"1 task {DONE[command]}."
    allowed = ", ".join(ACTION_STATES[Action(action)])
    assert lines[1].startswith(
        f"Skipped {refused_id} (queue 'emails'): it is {refused}; {action} applies to {allowed} tasks."
    )
    if refused == S.ACTIVE:
        assert lines[1].endswith(" Cancel it with rtq_cancel, or let it finish.")
    assert_moved(rtq, [movable], target)
    assert state_of(rtq, EMAILS, refused_id) == refused


@pytest.mark.parametrize(("command", "state", "target", "refused"), ACTIONS)
def test_an_action_by_id_as_json(
    rtq: Broker, command: str, state: TaskState, target: TaskState | None, refused: TaskState
):
    [movable] = make_tasks(rtq, state, EMAILS)

    assert run_json(command, movable) == {"action": command[4:], "count": 1, "ids": [movable], "skipped": []}


@pytest.mark.parametrize(("command", "state", "target", "refused"), ACTIONS)
def test_an_action_refuses_unknown_ids_and_acts_on_none(
    rtq: Broker, command: str, state: TaskState, target: TaskState | None, refused: TaskState
):
    [task_id] = make_tasks(rtq, state, EMAILS)

    assert command_error(command, task_id, "nope", "nada") == "Unknown task ids: nope, nada."
    assert ids_in(rtq, EMAILS, state) == [task_id]


@pytest.mark.parametrize(("command", "state", "target", "refused"), ACTIONS)
def test_an_action_on_a_whole_state(
    rtq: Broker, command: str, state: TaskState, target: TaskState | None, refused: TaskState
):
    ids = make_tasks(rtq, state, EMAILS, count=3)
    [bystander] = make_tasks(rtq, state, SEARCH)

    output = run(command, "--queue", EMAILS, "--all", str(state))

    assert output == f"3 {state} tasks of queue 'emails' {DONE[command]}.\n"
    assert_moved(rtq, ids, target)
    assert ids_in(rtq, SEARCH, state) == [bystander]
    data = run_json(command, "--queue", SEARCH, "--all", str(state))
    assert data == {
        "action": command[4:],
        "queue": SEARCH,
        "state": str(state),
        "count": 1,
        "skipped": 0,
        "job": data["job"],
    }
    assert Operations().bulk_job(SEARCH, data["job"]).finished


@pytest.mark.parametrize(("command", "state", "target", "refused"), ACTIONS)
def test_an_action_on_a_whole_state_refuses_bad_arguments(
    rtq: Broker, command: str, state: TaskState, target: TaskState | None, refused: TaskState
):
    [task_id] = make_tasks(rtq, state, EMAILS)

    assert command_error(command) == "Give task ids, or --queue QUEUE --all STATE."
    assert command_error(command, "--all", str(state)) == "--all needs --queue."
    assert command_error(command, task_id, "--queue", EMAILS, "--all", str(state)) == (
        "Give task ids or --all STATE, not both."
    )
    assert command_error(command, "--queue", "nope", "--all", str(state)).startswith("Unknown queue 'nope'.")
    assert command_error(command, "--queue", EMAILS, "--all", "bogus").startswith("Unknown state 'bogus'.")
    assert command_error(command, "--queue", EMAILS, "--all", str(refused)).startswith(
        f"{command} --all applies to "
    )
    assert ids_in(rtq, EMAILS, state) == [task_id]


def test_running_a_whole_state_leaves_workflows_where_they_are(rtq: Broker):
    [workflow_id] = make_tasks(rtq, S.WAITING, EMAILS)
    qk = rtq.queue(EMAILS)
    rtq.client.hset(qk.state, workflow_id, S.ARCHIVED)  # as if it had failed
    rtq.client.zrem(qk.state_set(S.WAITING), workflow_id)
    rtq.client.zadd(qk.state_set(S.ARCHIVED), {workflow_id: rtq.now_ms()})
    ids = make_tasks(rtq, S.ARCHIVED, EMAILS, count=2)

    output = run("rtq_run", "--queue", EMAILS, "--all", "archived")

    assert output == (
        "2 archived tasks of queue 'emails' moved to pending.\n"
        "1 workflow left archived: a finished workflow cannot be run again; enqueue it anew.\n"
    )
    assert ids_in(rtq, EMAILS, S.ARCHIVED) == [workflow_id]
    assert set(ids) <= set(ids_in(rtq, EMAILS, S.PENDING))


# Bulk jobs: progress, interruption, rtq_bulk


@pytest.fixture
def small_steps(monkeypatch):
    """Pages of 2 tasks, and a command's step of one page: a few tasks make a job of many steps."""
    monkeypatch.setattr("django_rtq.broker.bulk.PAGE", 2)
    monkeypatch.setattr(OperationsCommand, "step_seconds", 0)


def run_with_stderr(name: str, *args: str) -> tuple[str, str]:
    """Run a command; return what it wrote to stdout and to stderr."""
    out, err = io.StringIO(), io.StringIO()
    call_command(name, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_an_action_on_a_whole_state_shows_its_progress_on_stderr(rtq: Broker, small_steps):
    ids = make_tasks(rtq, S.ARCHIVED, EMAILS, count=5)

    out, err = run_with_stderr("rtq_delete", "--queue", EMAILS, "--all", "archived")

    assert out == "5 archived tasks of queue 'emails' deleted.\n"
    # After each step that leaves the job unfinished (the last page, of 1, ends it).
    assert err.splitlines() == [
        "2 of 5 tasks deleted (40%)",
        "4 of 5 tasks deleted (80%)",
    ]
    assert_moved(rtq, ids, None)


def test_with_json_an_action_on_a_whole_state_prints_no_progress(rtq: Broker, small_steps):
    make_tasks(rtq, S.RETRY, EMAILS, count=5)

    out, err = run_with_stderr("rtq_archive", "--queue", EMAILS, "--all", "retry", "--json")

    assert (json.loads(out)["count"], err) == (5, "")
    assert len(ids_in(rtq, EMAILS, S.ARCHIVED)) == 5


def test_an_interrupted_action_is_left_to_the_workers_and_rtq_bulk_carries_it_on(
    rtq: Broker, small_steps, monkeypatch
):
    ids = make_tasks(rtq, S.PENDING, EMAILS, count=5)

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(Operations, "carry_on", interrupted)
        error = command_error("rtq_archive", "--queue", EMAILS, "--all", "pending")

    [job] = Operations().bulk_jobs(EMAILS)
    assert error == (
        f"Interrupted with 2 of 5 tasks archived (40%): bulk job {job.id} on queue 'emails' is left to "
        f"the workers of the queue. `manage.py rtq_bulk` shows it; `manage.py rtq_bulk --carry-on {job.id}` "
        "carries it on here."
    )
    assert (job.finished, job.done, len(ids_in(rtq, EMAILS, S.PENDING))) == (False, 2, 3)

    out = run("rtq_bulk", "--carry-on", job.id, "--queue", EMAILS)

    assert out == f"Job {job.id} (archive the pending tasks of queue 'emails') finished: 5 tasks archived.\n"
    assert set(ids_in(rtq, EMAILS, S.ARCHIVED)) == set(ids)


def test_bulk_lists_the_jobs_and_how_far_they_got(rtq: Broker, clock: FakeClock, small_steps):
    make_tasks(rtq, S.PENDING, EMAILS, count=5)
    make_tasks(rtq, S.RETRY, SEARCH)
    unfinished = Operations().start_bulk(Action.ARCHIVE, EMAILS, [S.PENDING], budget=0)
    clock.advance(90)
    finished = Operations().start_bulk(Action.DELETE, SEARCH, [S.RETRY, S.ARCHIVED], budget=1)
    clock.advance(10)

    rows = table(run("rtq_bulk"))

    assert rows == [
        {
            "ID": finished.id,
            "QUEUE": SEARCH,
            "ACTION": "delete",
            "STATES": "retry, archived",
            "DONE": "1 of 1",
            "%": "100%",
            "STARTED BY": "-",
            "STARTED": "2023-11-14 22:14:50 UTC (10s ago)",
            "FINISHED": "2023-11-14 22:14:50 UTC (10s ago)",
        },
        {
            "ID": unfinished.id,
            "QUEUE": EMAILS,
            "ACTION": "archive",
            "STATES": "pending",
            "DONE": "2 of 5",
            "%": "40%",
            "STARTED BY": "-",
            "STARTED": "2023-11-14 22:13:20 UTC (1m 40s ago)",
            "FINISHED": "-",
        },
    ]
    [data] = run_json("rtq_bulk", "--queue", EMAILS)["jobs"]
    assert {key: data[key] for key in ("id", "action", "states", "done", "total", "percent", "finished")} == {
        "id": unfinished.id,
        "action": "archive",
        "states": ["pending"],
        "done": 2,
        "total": 5,
        "percent": 40,
        "finished": False,
    }
    assert (data["current_state"], data["started_at"], data["finished_at"]) == ("pending", START_TIME, None)
    assert run("rtq_bulk", "--queue", "default") == "No bulk jobs on queue 'default'.\n"


def test_bulk_carry_on_finishes_every_unfinished_job_with_progress(rtq: Broker, small_steps):
    ids = make_tasks(rtq, S.PENDING, EMAILS, count=5)
    job = Operations().start_bulk(Action.ARCHIVE, EMAILS, [S.PENDING], budget=0)

    out, err = run_with_stderr("rtq_bulk", "--carry-on")

    about = f"Job {job.id} (archive the pending tasks of queue 'emails')"
    assert err.splitlines() == [
        f"{about}: 2 of 5 tasks archived (40%)",
        f"{about}: 4 of 5 tasks archived (80%)",
    ]
    assert out == f"{about} finished: 5 tasks archived.\n"
    assert set(ids_in(rtq, EMAILS, S.ARCHIVED)) == set(ids)
    assert Operations().bulk_job(EMAILS, job.id).finished
    assert run("rtq_bulk", "--carry-on") == "No unfinished bulk jobs.\n"
    assert run_json("rtq_bulk", "--carry-on", job.id)["jobs"][0]["done"] == 5  # finished already: as it is


def test_bulk_refuses_bad_arguments(rtq: Broker):
    enqueue(rtq, EMAILS)

    assert command_error("rtq_bulk", "--carry-on", "nope", "nada") == (
        "Unknown bulk jobs: nope, nada (finished ones go after an hour)."
    )
    assert (
        command_error("rtq_bulk", "nope") == "Job ids go with --carry-on (without it, every job is listed)."
    )
    assert command_error("rtq_bulk", "--queue", "nope").startswith("Unknown queue 'nope'.")
    assert run("rtq_bulk") == "No bulk jobs.\n"


# rtq_cancel


def test_cancel_asks_the_workers_to_stop_an_active_task(rtq: Broker):
    [task_id] = make_tasks(rtq, S.ACTIVE, EMAILS)

    with subscribed(rtq, rtq.keys.cancel_channel) as pubsub:
        output = run("rtq_cancel", task_id)
        assert next_message(pubsub)["data"] == task_id

    assert output == f"Cancellation of {task_id} sent to 1 worker.\n"


def test_cancel_says_when_no_worker_listens(rtq: Broker):
    [task_id] = make_tasks(rtq, S.ACTIVE, EMAILS)

    assert run("rtq_cancel", task_id).startswith(f"No worker is listening, so {task_id} was not cancelled")
    assert run_json("rtq_cancel", task_id, "--queue", EMAILS) == {
        "cancelled": [{"id": task_id, "queue": EMAILS, "state": "active", "worker": WORKER, "listeners": 0}],
        "skipped": [],
        "gone": [],
    }


def test_cancel_archives_a_waiting_workflow_at_once(rtq: Broker):
    [workflow_id] = make_tasks(rtq, S.WAITING, EMAILS)

    assert run("rtq_cancel", workflow_id) == (
        f"Workflow {workflow_id} cancelled (archived); "
        "its children that have not started are archived next.\n"
    )
    assert state_of(rtq, EMAILS, workflow_id) == S.ARCHIVED


def test_cancel_skips_tasks_that_are_not_active(rtq: Broker):
    [pending] = enqueue(rtq, EMAILS)
    out = io.StringIO()

    with pytest.raises(CommandError, match="1 task skipped: only active, waiting tasks can be cancelled"):
        call_command("rtq_cancel", pending, "--json", stdout=out)

    assert json.loads(out.getvalue()) == {
        "cancelled": [],
        "skipped": [
            {
                "id": pending,
                "queue": EMAILS,
                "state": "pending",
                "reason": "it is pending; cancel applies to active, waiting tasks",
            }
        ],
        "gone": [],
    }
    assert command_error("rtq_cancel", "nope") == "Unknown task id: nope."


# rtq_pause, rtq_resume


def test_pause_and_resume_queues(rtq: Broker):
    enqueue(rtq, EMAILS)

    assert run("rtq_pause", EMAILS, "default") == "Queue 'emails' paused.\nQueue 'default' paused.\n"
    assert (rtq.is_paused(EMAILS), rtq.is_paused("default")) == (True, True)
    assert run("rtq_pause", EMAILS) == "Queue 'emails' was already paused.\n"

    assert run_json("rtq_resume", EMAILS) == {"queues": [{"queue": EMAILS, "paused": False, "changed": True}]}
    assert (rtq.is_paused(EMAILS), rtq.is_paused("default")) == (False, True)
    assert run("rtq_resume", EMAILS) == "Queue 'emails' was already running.\n"


def test_pause_refuses_an_unknown_queue_and_pauses_none(rtq: Broker):
    enqueue(rtq, EMAILS)

    assert (
        command_error("rtq_pause", EMAILS, "nope")
        == "Unknown queue 'nope'. Known queues: default, emails, low."
    )
    assert not rtq.is_paused(EMAILS)
    assert command_error("rtq_resume", "nope").startswith("Unknown queue 'nope'.")


# rtq_workers


def test_workers_lists_live_workers_and_their_tasks(rtq: Broker):
    running = [{"id": "t1", "task": "tests.noop", "queue": EMAILS, "started_at": START_TIME - 4}]
    rtq.write_worker("w-b", worker_info(rtq, "w-b", "beta", running), ttl_seconds=10)
    rtq.write_worker("w-a", worker_info(rtq, "w-a", "alpha", []), ttl_seconds=10)

    output = run("rtq_workers")

    assert table(output) == [
        {
            "ID": worker_id,
            "HOST": host,
            "PID": "4242",
            "QUEUES": "emails:3,search:1",
            "CONCURRENCY": "10",
            "IN FLIGHT": str(in_flight),
            "STARTED": "2023-11-14 21:13:20 UTC (1h 0m ago)",
        }
        for worker_id, host, in_flight in (("w-a", "alpha", 0), ("w-b", "beta", 1))
    ]
    assert table(output.split("Tasks in flight:\n")[1]) == [
        {
            "WORKER": "w-b",
            "TASK ID": "t1",
            "TASK": "tests.noop",
            "QUEUE": EMAILS,
            "STARTED": "2023-11-14 22:13:16 UTC (4.0s ago)",
        }
    ]
    assert [worker["id"] for worker in run_json("rtq_workers")["workers"]] == ["w-a", "w-b"]


def test_workers_without_any(rtq: Broker):
    assert run("rtq_workers") == "No live workers.\n"
    assert run_json("rtq_workers") == {"workers": []}


# rtq_purge


def test_purge_deletes_every_task_but_active_ones(rtq: Broker):
    made = populate(rtq)

    output = run("rtq_purge", EMAILS, "--no-input")

    assert output == (
        "Deleted 9 tasks of queue 'emails' (2 scheduled, 2 retry, 3 pending, 1 archived, 1 completed).\n"
        "1 active task left alone: cancel it with rtq_cancel, or let it finish.\n"
    )
    assert {state: ids_in(rtq, EMAILS, state) for state in S} == {
        s: made[S.ACTIVE] if s == S.ACTIVE else [] for s in S
    }
    assert len(ids_in(rtq, SEARCH, S.PENDING)) == 1


def test_purge_empties_every_state_but_active_a_page_at_a_time(rtq: Broker, small_steps):
    made = populate(rtq)
    made[S.WAITING] = make_tasks(rtq, S.WAITING, EMAILS, count=3)

    out, err = run_with_stderr("rtq_purge", EMAILS, "--no-input")

    assert out == (
        "Deleted 12 tasks of queue 'emails' "
        "(3 waiting, 2 scheduled, 2 retry, 3 pending, 1 archived, 1 completed).\n"
        "1 active task left alone: cancel it with rtq_cancel, or let it finish.\n"
    )
    assert {state: ids_in(rtq, EMAILS, state) for state in S} == {
        s: made[S.ACTIVE] if s == S.ACTIVE else [] for s in S
    }
    progress = err.splitlines()
    assert progress[0] == "2 of 12 tasks deleted (16%)" and len(progress) >= 6
    assert all(re.fullmatch(r"\d+ of 12 tasks deleted \(\d+%\)", line) for line in progress)


def test_purge_says_when_tasks_left_their_state_before_it_reached_them(rtq: Broker, small_steps, monkeypatch):
    populate(rtq)
    carry_on = Operations.carry_on
    claimed = []

    def a_worker_claims_meanwhile(self: Operations, queue: str, job_id: str, *, budget: float) -> Any:
        job = self.bulk_job(queue, job_id)
        if job.current_state == S.PENDING and job.remaining is not None and not claimed:
            claimed.extend(claim_ids(rtq, EMAILS))  # the last pending task, after a page of 2 went
        return carry_on(self, queue, job_id, budget=budget)

    monkeypatch.setattr(Operations, "carry_on", a_worker_claims_meanwhile)

    output = run("rtq_purge", EMAILS, "--no-input")

    assert len(claimed) == 1
    assert output == (
        "Deleted 8 tasks of queue 'emails' (of 9 found: 2 scheduled, 2 retry, 3 pending, 1 archived, "
        "1 completed; the others left meanwhile).\n"
        "2 active tasks left alone: cancel them with rtq_cancel, or let them finish.\n"
    )


def test_purge_as_json(rtq: Broker):
    populate(rtq)

    data = run_json("rtq_purge", SEARCH, "--noinput")

    assert data == {
        "queue": SEARCH,
        "purged": True,
        "deleted": {"waiting": 0, "scheduled": 0, "retry": 0, "pending": 1, "archived": 0, "completed": 0},
        "total": 1,
        "active_left": 0,
        "job": data["job"],
    }
    assert Operations().bulk_job(SEARCH, data["job"]).finished


@pytest.mark.parametrize("answer", ["no", "yes"])
def test_purge_asks_first(rtq: Broker, monkeypatch, answer: str):
    populate(rtq)
    monkeypatch.setattr("builtins.input", lambda: answer)

    output = run("rtq_purge", EMAILS)

    assert output.startswith(
        "This will delete every task of queue 'emails' that is not active "
        "(0 waiting, 2 scheduled, 2 retry, 3 pending, 1 archived, 1 completed).\n"
    )
    if answer == "yes":
        assert "Deleted 9 tasks" in output and ids_in(rtq, EMAILS, S.PENDING) == []
    else:
        assert output.endswith("Purge cancelled.\n") and len(ids_in(rtq, EMAILS, S.PENDING)) == 3


def test_purge_with_json_asks_on_stderr(rtq: Broker, monkeypatch):
    enqueue(rtq, EMAILS)
    monkeypatch.setattr("builtins.input", lambda: "no")
    out, err = io.StringIO(), io.StringIO()

    call_command("rtq_purge", EMAILS, "--json", stdout=out, stderr=err)

    assert json.loads(out.getvalue()) == {"queue": EMAILS, "purged": False}
    assert "Type 'yes' to continue" in err.getvalue()
    assert command_error("rtq_purge", "nope", "--no-input").startswith("Unknown queue 'nope'.")


# Errors on the command line


def test_an_error_exits_non_zero_with_a_message(rtq: Broker, capsys):
    command = load_command_class("django_rtq", "rtq_task")

    with pytest.raises(SystemExit) as exit_info:
        command.run_from_argv(["manage.py", "rtq_task", "nope", "--json", "--skip-checks"])

    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "CommandError: Unknown task id: nope.\n")


def test_redis_out_of_reach_is_a_command_error(prefix: str, settings):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": "redis://127.0.0.1:1/0"}

    assert command_error("rtq_stats").startswith("Cannot reach Redis: ")

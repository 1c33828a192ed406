"""The line each finished task gets on the "django_rtq.tasks" logger (RTQ["LOG_FINISHED_TASKS"]),
from an in-process worker on a real Redis: succeeded, failed and retried, archived, cancelled."""

from __future__ import annotations

import logging

import pytest

from django_rtq.broker import TaskState, manual
from tests.support.polling import wait_for
from tests.support.runs import reports, wait_state
from tests.testapp import tasks

LOGGER = "django_rtq.tasks"


@pytest.fixture
def task_lines(caplog):
    """The records of "django_rtq.tasks", at INFO (as `rtq_worker` sets its loggers by default)."""
    caplog.set_level(logging.INFO, LOGGER)
    return lambda: [record for record in caplog.records if record.name == LOGGER]


def lines_of(records, task_id: str) -> list[logging.LogRecord]:
    return [record for record in records if record.task_id == task_id]


def test_a_successful_task_gets_one_info_line_with_its_facts(run_worker, inspector, task_lines):
    message = tasks.add.enqueue(1, 2)
    with run_worker():
        wait_state(inspector, message.id, TaskState.COMPLETED)
        wait_for(lambda: lines_of(task_lines(), message.id), message="the task's line")

    [line] = lines_of(task_lines(), message.id)
    assert line.levelno == logging.INFO
    assert (line.task_name, line.queue, line.outcome) == ("tests.testapp.tasks.add", "default", "succeeded")
    assert 0 <= line.duration < 5
    text = line.getMessage()
    assert text.startswith(f"task {message.id!r} (tests.testapp.tasks.add) of queue 'default' succeeded in ")
    assert text.endswith(f"{line.duration:.3f}s")


def test_a_failed_task_gets_a_warning_per_retry_then_an_error_once_archived(
    run_worker, inspector, task_lines
):
    message = tasks.always_fails.enqueue("logged")  # max_retries=2: three attempts
    with run_worker():
        wait_state(inspector, message.id, TaskState.ARCHIVED)
        wait_for(lambda: len(lines_of(task_lines(), message.id)) == 3, message="three lines")

    lines = lines_of(task_lines(), message.id)
    assert [(line.levelno, line.outcome) for line in lines] == [
        (logging.WARNING, "failed-will-retry"),
        (logging.WARNING, "failed-will-retry"),
        (logging.ERROR, "archived"),
    ]
    assert "(builtins.ValueError: this task always fails); retry 1 of 2 in " in lines[0].getMessage()
    assert lines[2].getMessage().endswith("(builtins.ValueError: this task always fails); archived")
    assert all(line.duration is not None and " failed after " in line.getMessage() for line in lines)


def test_a_cancelled_task_says_so(run_worker, inspector, redis_client, task_lines):
    message = tasks.block.enqueue("cancelled-line")
    with run_worker(concurrency=1) as worker:
        wait_for(worker.subscriber.subscribed.is_set)
        wait_for(lambda: reports(redis_client, "cancelled-line:started"))
        assert manual.cancel(inspector.broker, "default", message.id, TaskState.ACTIVE) >= 1
        wait_state(inspector, message.id, TaskState.ARCHIVED)
        wait_for(lambda: lines_of(task_lines(), message.id), message="the task's line")

    [line] = lines_of(task_lines(), message.id)
    assert (line.levelno, line.outcome) == (logging.WARNING, "cancelled")
    assert " cancelled after " in line.getMessage() and line.getMessage().endswith("; archived")


def test_the_setting_turns_the_success_lines_off_not_the_failures(
    run_worker, inspector, settings, task_lines
):
    settings.RTQ = {**settings.RTQ, "LOG_FINISHED_TASKS": False}
    succeeded = tasks.add.enqueue(1, 2)
    failed = tasks.refuses.enqueue("no-retry")  # NonRetryableError: archived at once
    with run_worker():
        wait_state(inspector, succeeded.id, TaskState.COMPLETED)
        wait_state(inspector, failed.id, TaskState.ARCHIVED)
        wait_for(lambda: lines_of(task_lines(), failed.id), message="the failure's line")

    assert lines_of(task_lines(), succeeded.id) == []
    [line] = lines_of(task_lines(), failed.id)
    assert (line.levelno, line.outcome) == (logging.ERROR, "archived")

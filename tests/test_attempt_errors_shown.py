"""`rtq_task` shows each attempt's error readably: its message and traceback, its facts as text."""

from __future__ import annotations

import pytest

from django_rtq.broker import Broker, TaskMessage, TaskState
from django_rtq.management.commands.rtq_task import error_lines, fact_text
from django_rtq.worker.outcome import Failure, settle_failure
from tests.support.clock import START_TIME
from tests.support.commands import START, fields_of, run
from tests.support.factories import EMAILS, WORKER, claim, enqueue

BAD_ADDRESS_TRACEBACK = """\
Traceback (most recent call last):
  File "shop/tasks.py", line 12, in send_receipt
    send_mail(...)
ValueError: bad address
"""
GONE_TRACEBACK = """\
Traceback (most recent call last):
  File "shop/tasks.py", line 12, in send_receipt
    send_mail(...)
ConnectionError: the SMTP server went away
"""


def fail_attempt(broker: Broker, error: BaseException, traceback: str) -> TaskState | None:
    """Claim the task of EMAILS and settle its failure as a worker does."""
    [claimed] = claim(broker, EMAILS)
    message = TaskMessage.from_json(claimed.raw_message, id=claimed.id, queue=claimed.queue)
    failure = Failure(
        claimed=claimed, message=message, error=error, traceback=traceback, started_at=broker.clock()
    )
    return settle_failure(broker, failure, worker_id=WORKER)


def test_task_shows_each_attempt_error_with_its_traceback(rtq: Broker):
    [task_id] = enqueue(rtq, EMAILS, max_retries=3)
    assert fail_attempt(rtq, ValueError("bad address"), BAD_ADDRESS_TRACEBACK) == TaskState.RETRY
    assert rtq.forward(EMAILS) == 1  # due at once: a task type this process lacks has no backoff
    gone = ConnectionError("the SMTP server went away")
    assert fail_attempt(rtq, gone, GONE_TRACEBACK) == TaskState.RETRY

    output = run("rtq_task", task_id)

    fields = fields_of(output)
    assert fields["retried"] == "2"
    assert fields["last error"] == "builtins.ConnectionError: the SMTP server went away"
    assert fields["workers"] == f"{WORKER}, {WORKER}"
    assert fields["started_at"] == START
    errors = output.split("\nErrors, oldest first\n", 1)[1].splitlines()
    assert errors == [
        "  builtins.ValueError: bad address",
        "      Traceback (most recent call last):",
        '        File "shop/tasks.py", line 12, in send_receipt',
        "          send_mail(...)",
        "      ValueError: bad address",
        "",
        "  builtins.ConnectionError: the SMTP server went away",
        "      Traceback (most recent call last):",
        '        File "shop/tasks.py", line 12, in send_receipt',
        "          send_mail(...)",
        "      ConnectionError: the SMTP server went away",
    ]
    assert "{'" not in output and "['" not in output  # no Python reprs


def test_an_error_without_a_traceback_shows_its_whole_message():
    error = {"type": "tests.StepError", "message": "no input\nfor step 2", "traceback": ""}

    assert error_lines(error) == ["  tests.StepError: no input", "  for step 2"]


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("failed_at", START_TIME, START),
        ("workers", ["web-1:42:ab", "web-2:7:cd"], "web-1:42:ab, web-2:7:cd"),
        ("workers", [], None),
        ("progress", {"done": 2, "total": 5}, '{"done": 2, "total": 5}'),
        ("children", [{"id": "c1", "queue": "emails"}], '[{"id": "c1", "queue": "emails"}]'),
        ("recovered", 1, 1),
    ],
)
def test_attempt_facts_are_shown_as_text_not_reprs(key, value, text):
    assert fact_text(key, value) == text

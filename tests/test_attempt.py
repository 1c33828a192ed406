"""A task's attempt facts (broker/attempt.py): read typed, written in today's stored shape, and
the one rule that says whether a failed attempt runs again."""

from __future__ import annotations

import json

import pytest

from django_rtq.broker.attempt import AttemptInfo, error_path, will_retry
from django_rtq.exceptions import CorruptWorkflow, DeadlineExceeded, NonRetryableError, TaskCancelled

STORED = {
    "started_at": 100.0,
    "attempted_at": 130.5,
    "worker": "w2",
    "workers": ["w1", "w2"],
    "error_type": "builtins.ValueError",
    "error": "bad",
    "traceback": "Traceback ...",
    "errors": [{"type": "builtins.ValueError", "message": "bad", "traceback": "Traceback ..."}, "junk"],
    "failed_at": 131.0,
    "retried": 1,
    "recovered": 2,
}


def test_the_stored_info_reads_typed_and_writes_back_as_it_was():
    info = AttemptInfo.from_json(json.dumps(STORED))
    assert (info.retried, info.worker, info.workers) == (1, "w2", ["w1", "w2"])
    assert (info.started_at, info.attempted_at, info.ended_at) == (100.0, 130.5, 131.0)
    assert (info.error_type, info.error, info.traceback) == ("builtins.ValueError", "bad", "Traceback ...")
    assert info.error_records == [STORED["errors"][0]]
    assert info.get("recovered") == 2
    assert info.as_dict() == STORED and list(info.as_dict()) == list(STORED)


def test_facts_missing_or_of_the_wrong_type_read_as_nothing():
    assert AttemptInfo.from_json(None) == AttemptInfo.from_mapping({}) == AttemptInfo()
    info = AttemptInfo.from_mapping({"retried": "3", "workers": "w1", "started_at": True, "error": 5})
    assert (info.retried, info.workers, info.started_at, info.error) == (0, [], None, None)
    assert AttemptInfo.from_mapping({"finished_at": 5.0, "failed_at": 4.0}).ended_at == 5.0


def test_a_failed_attempt_is_written_as_the_worker_wrote_it():
    error = ValueError("worse")
    written = AttemptInfo.from_mapping(STORED).failed(
        error, "tb", worker_id="w3", started_at=140.0, failed_at=141.0, retrying=True
    )
    assert written == {
        **STORED,
        "attempted_at": 140.0,
        "worker": "w3",
        "workers": ["w1", "w2", "w3"],
        "error_type": "builtins.ValueError",
        "error": "worse",
        "traceback": "tb",
        "errors": [*STORED["errors"], {"type": "builtins.ValueError", "message": "worse", "traceback": "tb"}],
        "failed_at": 141.0,
        "retried": 2,
    }
    first = AttemptInfo().failed(error, "", worker_id="w1", started_at=10.0, failed_at=11.0, retrying=False)
    assert first["started_at"] == 10.0 and "retried" not in first


@pytest.mark.parametrize("error", [NonRetryableError("no"), DeadlineExceeded("late"), TaskCancelled("stop")])
def test_errors_that_archive_at_once_are_never_retried(error):
    assert not will_retry(error, retried=0, max_retries=5, deadline=None, now=0.0)


def test_a_retry_needs_retries_left_and_time_before_the_deadline():
    error = ValueError("again")
    assert will_retry(error, retried=1, max_retries=2, deadline=None, now=0.0)
    assert not will_retry(error, retried=2, max_retries=2, deadline=None, now=0.0)
    assert will_retry(error, retried=0, max_retries=2, deadline=10.0, now=9.0)
    assert not will_retry(error, retried=0, max_retries=2, deadline=10.0, now=10.0)


def test_an_error_path_is_its_class_dotted_path():
    assert error_path(ValueError("x")) == "builtins.ValueError"
    assert error_path(CorruptWorkflow) == "django_rtq.exceptions.CorruptWorkflow"

"""The errors users catch import from the package itself: `django_rtq` gives the classes
`django_rtq.exceptions` defines."""

from __future__ import annotations

import pytest

import django_rtq
from django_rtq import exceptions


@pytest.mark.parametrize(
    "name",
    [
        "BrokerUnavailable",
        "BulkJobNotFound",
        "CheckpointNotSaved",
        "DeadlineExceeded",
        "DuplicateTask",
        "InvalidArguments",
        "InvalidStateTransition",
        "InvalidTask",
        "LeaseLost",
        "NonRetryableError",
        "QueueNotFound",
        "RTQError",
        "StoppedAtCheckpoint",
        "TaskCancelled",
        "TaskIdConflict",
        "TaskNotFound",
        "TaskTimeout",
        "WorkerShutdown",
        "WorkflowTooDeep",
    ],
)
def test_the_errors_users_catch_come_from_the_package(name):
    exported = getattr(django_rtq, name)

    assert exported is getattr(exceptions, name)
    assert name in django_rtq.__all__
    assert issubclass(exported, exceptions.RTQError)


def test_the_errors_of_enqueueing_import_from_the_package():
    from django_rtq import BrokerUnavailable, DuplicateTask, NonRetryableError, TaskIdConflict

    assert (DuplicateTask, TaskIdConflict, BrokerUnavailable, NonRetryableError) == (
        exceptions.DuplicateTask,
        exceptions.TaskIdConflict,
        exceptions.BrokerUnavailable,
        exceptions.NonRetryableError,
    )

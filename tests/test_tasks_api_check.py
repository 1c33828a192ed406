"""Check E005: a missing `django.tasks` API (Django 6.0+, or the backport on Django 5.2) is an
error where the RTQ backend is configured, and only there."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_rtq.checks import TAG, tasks_api_module
from tests.support.checks import RTQ_BACKEND, ids, messages


@contextmanager
def tasks_api_missing() -> Iterator[None]:
    """Inside, `django.tasks` and `django_tasks` cannot be imported (a None in sys.modules stops
    an import). Change settings.TASKS outside: their receivers of `setting_changed` import them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "django.tasks", None)
        patch.setitem(sys.modules, "django_tasks", None)
        yield


def test_the_check_finds_the_api_where_the_backend_does():
    from django_rtq.backends import BaseTaskBackend

    assert tasks_api_module() == BaseTaskBackend.__module__.removesuffix(".backends.base")


def test_without_the_tasks_api_no_module_is_found():
    with tasks_api_missing():
        assert tasks_api_module() is None


def test_the_rtq_backend_without_the_tasks_api_is_an_error(settings):
    settings.TASKS = {"default": {"BACKEND": RTQ_BACKEND, "QUEUES": ["default"]}}

    with tasks_api_missing():
        assert ids() == ["django_rtq.E005"]
        [message] = messages("django_rtq.E005")
        with pytest.raises(SystemCheckError, match=r"django_rtq\.E005.*tasks-backport"):
            call_command("check", "--tag", TAG)
    assert message.startswith("django_rtq.backends.RTQBackend (of 'default') needs the django.tasks API")
    assert 'pip install "django-rtq[tasks-backport]"' in message
    assert "Django 6.0+ has it built in" in message
    assert ids() == []  # once it can be imported again


def test_one_error_names_every_alias_of_the_rtq_backend(settings):
    settings.TASKS = {
        "default": {"BACKEND": RTQ_BACKEND},
        "local": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
        "emails": {"BACKEND": RTQ_BACKEND},
    }

    with tasks_api_missing():
        [message] = messages("django_rtq.E005")
    assert message.startswith("django_rtq.backends.RTQBackend (of 'default', 'emails') needs ")


@pytest.mark.parametrize(
    "tasks",
    [{}, {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}],
)
def test_without_the_rtq_backend_a_missing_tasks_api_is_fine(settings, tasks):
    settings.TASKS = tasks

    with tasks_api_missing():
        assert ids() == []


def test_without_a_tasks_setting_a_missing_tasks_api_is_fine(settings):
    del settings.TASKS

    with tasks_api_missing():
        assert ids() == []

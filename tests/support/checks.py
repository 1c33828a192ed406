"""Running django_rtq's system checks as `manage.py check` does, and reading what they say."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import run_checks

from django_rtq.checks import TAG

RTQ_BACKEND = "django_rtq.backends.RTQBackend"


def ids(**kwargs) -> list[str]:
    """The ids of the checks that speak, less those the settings silence (as `manage.py check`)."""
    silenced = set(settings.SILENCED_SYSTEM_CHECKS)
    return sorted(message.id for message in run_checks(tags=[TAG], **kwargs) if message.id not in silenced)


def messages(check_id: str, **kwargs) -> list[str]:
    return [m.msg for m in run_checks(tags=[TAG], **kwargs) if m.id == check_id]

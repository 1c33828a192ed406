"""The outbox's rows, made due at once (instead of waiting for their next attempt)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from django_rtq.models import OutboxTask


def make_due() -> None:
    """Make every row of the outbox due now."""
    OutboxTask.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))

"""Times and counts as people and Django read them: one way, for every surface."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone


def plural(count: int, noun: str) -> str:
    """`1 task`, `1,200 tasks`."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def format_duration(seconds: float | None) -> str | None:
    """A length of time the way people say it: 0.4s, 45s, 3m 20s, 2h 5m, 3d 4h."""
    if seconds is None:
        return None
    if seconds < 10:
        return f"{seconds:.1f}s"
    days, rest = divmod(round(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def utc_datetime(epoch_seconds: Any) -> datetime | None:
    """An aware UTC datetime from epoch seconds (as Redis keeps times); None for anything else."""
    if isinstance(epoch_seconds, bool) or not isinstance(epoch_seconds, int | float):
        return None
    try:
        return datetime.fromtimestamp(epoch_seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def django_datetime(epoch_seconds: Any) -> datetime | None:
    """An epoch time as Django keeps times: aware in UTC, or naive local time without USE_TZ."""
    moment = utc_datetime(epoch_seconds)
    if moment is None or settings.USE_TZ:
        return moment
    return timezone.make_naive(moment)

"""Filters of the admin's live pages: counts, times, JSON and long values, one way everywhere."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil

from ..broker.limits import scope_label
from ..formats import django_datetime

register = template.Library()


@register.filter
def rtq_count(value: Any) -> str:
    """A whole number with thousands separators (1,234,567), as Django's `intcomma` writes it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "" if value is None else str(value)
    return f"{value:,}" if isinstance(value, int) or value.is_integer() else f"{value:,.2f}"


def as_datetime(value: Any) -> datetime | None:
    """A datetime from a datetime or epoch seconds; None for anything else."""
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else timezone.make_aware(value)
    moment = django_datetime(value)
    if moment is not None and timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return moment


def relative(moment: datetime, now: datetime | None = None) -> str:
    """`3 minutes ago`, `in 2 hours`, `just now`."""
    now = now or datetime.now(UTC)  # aware whatever USE_TZ says, as `moment` is
    seconds = (moment - now).total_seconds()
    if abs(seconds) < 60:
        return "just now" if seconds <= 0 else "in under a minute"
    # Django joins number and unit with a no-break space; a plain one reads and searches the same
    if seconds < 0:
        return f"{timesince(moment, now, depth=1)} ago".replace("\xa0", " ")
    return f"in {timeuntil(moment, now, depth=1)}".replace("\xa0", " ")


def raw_time(moment: datetime) -> str:
    """What a time's tooltip says: local time, ISO 8601 in UTC, and epoch seconds."""
    local = timezone.localtime(moment)
    utc = moment.astimezone(UTC)
    iso = utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} · {iso} · epoch {moment.timestamp():.3f}"


@register.filter
def rtq_when(value: Any) -> SafeString | str:
    """A time as people read it (`3 minutes ago`), the exact one on hover; "" for no time."""
    moment = as_datetime(value)
    if moment is None:
        return ""
    return format_html(
        '<time class="rtq-time" datetime="{}" data-epoch="{}" title="{}">{}</time>',
        moment.isoformat(),
        f"{moment.timestamp():.3f}",
        raw_time(moment),
        relative(moment),
    )


@register.filter
def rtq_when_full(value: Any) -> SafeString | str:
    """A time in local time with how long ago (or until) it is, the raw values on hover."""
    moment = as_datetime(value)
    if moment is None:
        return ""
    local = timezone.localtime(moment)
    return format_html(
        '<time class="rtq-time" datetime="{}" data-epoch="{}" title="{}">{} {} ({})</time>',
        moment.isoformat(),
        f"{moment.timestamp():.3f}",
        raw_time(moment),
        f"{local:%Y-%m-%d %H:%M:%S}",
        local.tzname(),
        relative(moment),
    )


@register.filter
def rtq_short(value: Any) -> SafeString | str:
    """A long value cut to its box by CSS, in full in the page (copying it) and on hover."""
    if value is None or value == "":
        return ""
    return format_html('<span class="rtq-trunc" title="{}">{}</span>', value, value)


@register.filter
def rtq_scope(scope: str) -> SafeString:
    """A flow-control scope as `scope_label` words it, the task's and the partition's names each
    cut to its box (a partition's name is what tells its rows apart)."""
    return mark_safe(scope_label(scope, name=lambda part: str(rtq_short(part))))  # parts escaped


def pretty_json(value: Any) -> str:
    """JSON indented by two, non-ASCII kept: the way every payload, result and error is shown."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


@register.filter
def rtq_json(value: Any) -> SafeString:
    """A value as pretty-printed JSON in a <pre>, with a copy button."""
    return rtq_pre(pretty_json(value))


@register.filter
def rtq_pre(text: Any) -> SafeString:
    """Text exactly as written (a traceback: indentation kept), in a <pre> with a copy button."""
    return format_html(
        '<div class="rtq-code"><button type="button" class="rtq-copy" title="Copy to the clipboard">'
        'Copy</button><pre class="rtq-pre">{}</pre></div>',
        "" if text is None else str(text),
    )


#: Longest arguments a list cell carries (in full on hover); the task page shows them all.
ARGUMENTS_SHOWN = 2000


@register.filter
def rtq_arguments(value: Any) -> SafeString | str:
    """A call's [args, kwargs] on one line, as compact JSON without the outer brackets, cut to its box."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        return ""
    text = json.dumps(list(value), ensure_ascii=False, default=str)[1:-1]
    if len(text) > ARGUMENTS_SHOWN:
        text = text[: ARGUMENTS_SHOWN - 1] + "…"
    return rtq_short(text)

"""Charts drawn on the server as inline SVG: no JavaScript, no external files."""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

#: Colours of the bars (the admin's own blue, and a red that reads on light and dark themes).
PROCESSED_COLOUR = "#417690"
FAILED_COLOUR = "#ba2121"
#: Intervals between the horizontal grid lines.
GRID_LINES = 5


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least `value` (at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # unreachable: 10 * power >= value always


def history_chart(
    history: Sequence[tuple[str, int, int]], *, width: int = 760, height: int = 220
) -> SafeString:
    """Draw (day, processed, failed) rows as bars: processed in blue, the failed part of it in red.

    Each bar has a <title>, which browsers show as a tooltip.
    """
    left, right, top, bottom = 48, 8, 24, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    # 5 grid intervals on a 1-2-5 scale of at least 5: every grid line falls on a whole number
    top_value = max(GRID_LINES, nice_ceiling(max((processed for _, processed, _ in history), default=0)))
    slot = plot_w / max(len(history), 1)
    bar_w = max(slot * 0.7, 1.0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="rtq-chart" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        "<title>Processed and failed tasks per day (UTC)</title>",
    ]
    for i in range(GRID_LINES + 1):  # grid lines and their labels
        value = top_value * i // GRID_LINES
        y = top + plot_h - plot_h * i / GRID_LINES
        label = f"{value:,}"
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
            f'stroke="currentColor" stroke-opacity="0.15"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="currentColor">{label}</text>'
        )
    label_every = max(1, math.ceil(len(history) / 10))
    for i, (day, processed, failed) in enumerate(history):
        x = left + i * slot + (slot - bar_w) / 2
        tip = escape(f"{day}: {processed:,} processed, {failed:,} failed")
        for value, colour in ((processed, PROCESSED_COLOUR), (failed, FAILED_COLOUR)):
            if value <= 0:
                continue
            bar_h = plot_h * min(value, top_value) / top_value
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - bar_h:.1f}" width="{bar_w:.1f}" '
                f'height="{bar_h:.1f}" fill="{colour}"><title>{tip}</title></rect>'
            )
        if i % label_every == 0 or i == len(history) - 1:
            parts.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{height - bottom + 16}" text-anchor="middle" '
                f'fill="currentColor">{escape(day[5:])}</text>'
            )
    legend_y = 12
    parts.append(
        f'<rect x="{left}" y="{legend_y - 9}" width="10" height="10" fill="{PROCESSED_COLOUR}"/>'
        f'<text x="{left + 14}" y="{legend_y}" fill="currentColor">processed</text>'
        f'<rect x="{left + 90}" y="{legend_y - 9}" width="10" height="10" fill="{FAILED_COLOUR}"/>'
        f'<text x="{left + 104}" y="{legend_y}" fill="currentColor">failed</text>'
    )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every value above is a number or escaped

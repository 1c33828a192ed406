"""Plain-text output for the management commands: aligned tables and times."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from django_rtq.formats import format_duration, utc_datetime

#: How an absent value is shown in a table.
BLANK = "-"

Style = Callable[[str], str]


def cell_text(value: object) -> str:
    """Render one value for a table cell: None as a dash, booleans as yes/no, text on one line."""
    if value is None:
        return BLANK
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value)
    return " ".join(text.split()) if "\n" in text else text


def render_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    header_style: Style | None = None,
    gap: int = 2,
) -> list[str]:
    """Return the lines of a table whose columns are aligned; numbers are right-aligned.

    Widths are measured on the plain text, so styling the header (colours) does not skew them.
    """
    rows = list(rows)
    texts = [[cell_text(value) for value in row] for row in rows]
    widths = [len(header) for header in headers]
    for row in texts:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [_is_numeric_column([row[i] for row in rows]) for i in range(len(headers))]
    spacer = " " * gap

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(cells, widths, numeric, strict=True)
        ]
        return spacer.join(padded).rstrip()

    header = line(list(headers))
    lines = [header_style(header) if header_style else header]
    lines.extend(line(row) for row in texts)
    return lines


def _is_numeric_column(values: list[object]) -> bool:
    """A column of numbers, blanks aside, is right-aligned."""
    return any(_is_number(v) for v in values) and all(_is_number(v) or v is None for v in values)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render_fields(pairs: Iterable[tuple[str, object]], *, label_style: Style | None = None) -> list[str]:
    """Return `label  value` lines with the values aligned, for showing one record."""
    pairs = list(pairs)
    width = max((len(label) for label, _ in pairs), default=0)
    lines = []
    for label, value in pairs:
        padded = f"{label}:".ljust(width + 1)
        lines.append(f"{label_style(padded) if label_style else padded}  {cell_text(value)}")
    return lines


def shorten(text: str | None, width: int = 60) -> str | None:
    """Cut a text to `width` characters on one line, marking the cut with an ellipsis."""
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def format_time(epoch: float | None) -> str | None:
    """Format epoch seconds as a UTC time to the second."""
    moment = utc_datetime(epoch)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else None


def format_relative(epoch: float | None, now: float) -> str | None:
    """Format a time with how far it is from now: `2023-11-14 22:14:20 UTC (in 1m 0s)`."""
    if epoch is None:
        return None
    delta = epoch - now
    when = f"in {format_duration(delta)}" if delta >= 0 else f"{format_duration(-delta)} ago"
    return f"{format_time(epoch)} ({when})"

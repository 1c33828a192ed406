"""Counting recorded runs: the most starts in a window, the most runs at once (bench and tests)."""

from __future__ import annotations


def most_starts_within(starts: list[float], seconds: float) -> int:
    """The most starts in any window [t, t + seconds)."""
    starts, most, first = sorted(starts), 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one instant (one that ends as another starts: not both)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most

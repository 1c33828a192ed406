"""The health file a worker keeps fresh while all its threads live, for `python -m django_rtq.probe`."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class HealthBeat(Protocol):
    """What a worker tells of its health, several times a second, while all its threads live."""

    def beat(self, ready: bool | None) -> None: ...

    def remove(self) -> None: ...


def write_health_file(path: str, *, ready: bool, interval: float, **extra: Any) -> None:
    """Write the health file atomically (a temporary file renamed over it): a probe never reads
    half a file. `interval` is how often it is rewritten; the probe's default max age follows."""
    data = {"pid": os.getpid(), "written_at": time.time(), "ready": ready, "interval": interval, **extra}
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".rtq-health-", dir=directory)
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(data, file)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class HealthFile:
    """The health file of a worker process (or of a supervisor, for all its children): rewritten
    at most every `interval` seconds by `beat()`, removed once the worker has stopped."""

    def __init__(self, path: str, interval: float) -> None:
        self.path = path
        self.interval = interval
        self._written_at: float | None = None  # time.monotonic()
        self._failing = False

    def beat(self, ready: bool | None, **extra: Any) -> None:
        now = time.monotonic()
        if self._written_at is not None and now - self._written_at < self.interval:
            return
        try:
            write_health_file(self.path, ready=bool(ready), interval=self.interval, **extra)
        except OSError as exc:
            if not self._failing:  # said once, not at every beat
                logger.error("cannot write the health file %s: %s", self.path, exc)
            self._failing = True
            return
        self._failing = False
        self._written_at = now

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class ChildBeats:
    """Each supervised worker process's last beat (time.time()) and readiness, in memory it
    shares with its supervisor: the supervisor writes the one health file for all of them."""

    def __init__(self, context: Any, slots: int) -> None:
        self._values = context.RawArray("d", 2 * slots)
        for slot in range(slots):
            self.reset(slot)

    def reset(self, slot: int) -> None:
        """A child starts in the slot: it counts as fresh, its readiness not yet known."""
        self._values[2 * slot + 1] = math.nan
        self._values[2 * slot] = time.time()

    def beat(self, slot: int, ready: bool | None) -> None:
        self._values[2 * slot + 1] = math.nan if ready is None else float(ready)
        self._values[2 * slot] = time.time()

    def read(self, slot: int) -> tuple[float, bool | None]:
        """Seconds since the child's last beat, and its readiness (None: not known yet)."""
        ready = self._values[2 * slot + 1]
        return time.time() - self._values[2 * slot], None if math.isnan(ready) else bool(ready)

    def slot(self, slot: int) -> SlotBeat:
        return SlotBeat(self, slot)


class SlotBeat:
    """A supervised worker process's `HealthBeat`: its slot in its supervisor's ChildBeats."""

    def __init__(self, beats: ChildBeats, slot: int) -> None:
        self.beats = beats
        self.index = slot

    def beat(self, ready: bool | None) -> None:
        self.beats.beat(self.index, ready)

    def remove(self) -> None:
        pass  # the supervisor's file: it goes on while a replacement starts


def resident_mb() -> float:
    """The process's resident memory (RSS) in MB: /proc/self/statm where there is one, else the
    peak RSS getrusage reports (which never goes down)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10

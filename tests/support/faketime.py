"""Processes on a wrong wall clock: libfaketime preloaded (Debian's package `faketime`)."""

from __future__ import annotations

import glob
import os

import pytest

#: Where distributions install the library; RTQ_TEST_LIBFAKETIME names another.
LIBRARY_PATTERNS = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")


def libfaketime() -> str:
    """The path of libfaketime; the test fails (it is not skipped) when it is not installed."""
    given = os.environ.get("RTQ_TEST_LIBFAKETIME")
    found = [given] if given else [path for pattern in LIBRARY_PATTERNS for path in glob.glob(pattern)]
    if not found or not os.path.exists(found[0]):
        pytest.fail(
            "the clock tests need libfaketime: apt-get install faketime (or set RTQ_TEST_LIBFAKETIME)"
        )
    return found[0]


def clock_off_by(seconds: int) -> dict[str, str]:
    """The environment of a process whose wall clock (time.time(), datetime.now()) reads `seconds`
    off the real one. Its monotonic clock is left true: with it faked too (libfaketime 0.9.10), a
    lock's or an event's timed wait never returns. Even so, `time.sleep` fails there with EINVAL
    (libfaketime mistranslates the absolute monotonic deadline Python sleeps to): the worker does
    not sleep that way, and the handlers these processes run must not either."""
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": f"{seconds:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }

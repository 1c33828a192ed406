"""`python -m django_rtq.probe live|ready --file PATH`: a worker's health, read without Django.

The worker (`rtq_worker --health-file PATH`, or RTQ["HEALTH_FILE"]) rewrites PATH every
interval only while every one of its threads is alive; with `--processes`, its supervisor
writes it for all its worker processes. `live` passes while the file is fresh; `ready` also
needs Redis to have answered the worker's last ping. Exit status 0 passes, 1 fails, with one
line saying why. This module imports nothing of Django's, nor of the rest of django-rtq, so
that a probe a kubelet runs every few seconds costs a bare Python start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

#: By default a file older than this many of the worker's intervals (it records its interval)
#: is stale: a missed write or two is not a failure.
MAX_AGE_INTERVALS = 3
#: The max age (seconds) when the file does not say its interval.
FALLBACK_MAX_AGE = 45.0


def check(kind: str, path: str, max_age: float | None = None, now: float | None = None) -> tuple[bool, str]:
    """Whether the worker whose health file is at `path` is live (`kind` "live") or ready
    ("ready"), and one line saying why."""
    try:
        with open(path) as file:
            data: dict[str, Any] = json.load(file)
        written_at = float(data["written_at"])
    except FileNotFoundError:
        return False, (
            f"not {kind}: no health file at {path} (the worker is not running, has not started yet, "
            "or was not given --health-file)"
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return False, f"not {kind}: cannot read the health file {path}: {exc}"
    interval = data.get("interval")
    if max_age is None:
        max_age = MAX_AGE_INTERVALS * float(interval) if interval else FALLBACK_MAX_AGE
    age = (time.time() if now is None else now) - written_at
    who = f"worker pid {data.get('pid')}"
    if age > max_age:
        return False, (
            f"not {kind}: {who} last wrote its health file {age:.1f}s ago (max age {max_age:g}s): "
            "it is stuck, or one of its threads died"
        )
    if kind == "ready" and not data.get("ready"):
        return False, f"not ready: Redis did not answer {who}'s last ping (as of {age:.1f}s ago)"
    return True, f"{kind}: {who}, health file written {age:.1f}s ago"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_rtq.probe",
        description="Check a django-rtq worker's health file: exit 0 if it passes, 1 if not.",
    )
    parser.add_argument(
        "kind", choices=["live", "ready"], help="live: the worker runs; ready: and Redis answers it"
    )
    parser.add_argument("--file", required=True, help="The worker's health file (rtq_worker --health-file).")
    parser.add_argument(
        "--max-age",
        type=float,
        metavar="SECONDS",
        help=f"Oldest the file may be (default: {MAX_AGE_INTERVALS} times the interval it records).",
    )
    options = parser.parse_args(argv)
    passed, line = check(options.kind, options.file, options.max_age)
    print(line)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

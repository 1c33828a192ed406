"""Running the management commands on a fake clock, and reading their tables and fields."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.core.management import call_command

from django_rtq.broker import Broker
from tests.support.clock import FakeClock
from tests.support.factories import EMAILS, SEARCH

#: START_TIME as the tables show it.
START = "2023-11-14 22:13:20 UTC"


@pytest.fixture
def rtq(broker: Broker, clock: FakeClock) -> Broker:
    """The broker the commands use (the process's own), on this test's prefix and a fake clock."""
    broker.clock = clock
    return broker


def run(name: str, *args: str, **options: Any) -> str:
    """Run a command; return what it wrote to stdout."""
    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def table(output: str) -> list[dict[str, str]]:
    """Parse the first table of an output: one dict per row, by column header."""
    lines = output.splitlines()
    headers = re.split(r"\s{2,}", lines[0].strip())
    rows = []
    for line in lines[1:]:
        if not line.strip():
            break
        rows.append(dict(zip(headers, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


def fields_of(output: str) -> dict[str, str]:
    """Parse the `label:  value` lines of an output."""
    return dict(re.findall(r"^(\w[\w ]*):\s+(.*)$", output, re.MULTILINE))


def worker_info(broker: Broker, worker_id: str, host: str, running: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": worker_id,
        "host": host,
        "pid": 4242,
        "queues": {EMAILS: 3, SEARCH: 1},
        "strict": False,
        "concurrency": 10,
        "started_at": broker.clock() - 3600,
        "active": running,
    }

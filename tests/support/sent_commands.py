"""Recording the commands a broker sends one at a time, whichever way they go: its client's
`execute_command`, or its script lane (django_rtq/broker/lane.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_rtq.broker import Broker


def record_commands(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, record: Callable[[tuple[Any, ...]], None]
) -> None:
    """Call `record(command)` before each command the broker sends outside a pipeline."""

    def recording(execute: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*command: Any, **options: Any) -> Any:
            record(command)
            return execute(*command, **options)

        return wrapper

    if broker.lane.pool is not None:  # else the lane sends through the client's execute_command
        monkeypatch.setattr(broker.lane, "execute", recording(broker.lane.execute))
    monkeypatch.setattr(broker.client, "execute_command", recording(broker.client.execute_command))

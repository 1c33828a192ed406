"""Django's `django.tasks` as the backend's tests watch it: its signals as sent, and results
polled until they reach a status."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django_rtq.backends import task_enqueued, task_finished, task_started
from tests.support.polling import wait_for


@dataclass(frozen=True)
class Sent:
    """One signal as it was sent: which, its result, and the result's status then."""

    signal: str
    result: Any
    status: str


@contextmanager
def djangos_signals() -> Iterator[list[Sent]]:
    """The `task_enqueued`, `task_started` and `task_finished` signals sent meanwhile, in order."""
    sent: list[Sent] = []
    receivers = {}
    for name, signal in (("enqueued", task_enqueued), ("started", task_started), ("finished", task_finished)):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            sent.append(Sent(_name, task_result, task_result.status))

        receivers[signal] = receiver
        signal.connect(receiver)
    try:
        yield sent
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)


def of(sent: list[Sent], result_id: str, signal: str | None = None) -> list[Sent]:
    """The signals sent for one result (of one kind)."""
    return [s for s in sent if s.result.id == result_id and (signal is None or s.signal == signal)]


def wait_status(result: Any, status: str, timeout: float = 10.0) -> Any:
    """Refresh `result` until it has `status`; return it."""

    def reached() -> bool:
        result.refresh()
        return result.status == status

    wait_for(reached, timeout, message=f"task {result.id} to be {status}")
    return result

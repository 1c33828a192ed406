"""The seam every enqueue goes through, `Broker.enqueue` (and `Broker.send_outboxed` for the
outbox's tasks, `Broker.announce_signatures` for what goes ahead of them), and who intercepts it now."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from ..broker import Broker
from ..broker.broker import OUTBOX_SENT
from ..broker.message import TaskMessage
from ..message_builder import give_back_unannounced

#: What an interceptor receives instead of Redis: the messages of one enqueue call.
Interceptor = Callable[[list[TaskMessage]], None]

_lock = threading.RLock()
_interceptors: list[Interceptor] = []
_original_enqueue = Broker.enqueue
_original_send_outboxed = Broker.send_outboxed
_original_announce_signatures = Broker.announce_signatures


def _intercepted_enqueue(self: Broker, messages: Sequence[TaskMessage]) -> dict[int, str]:
    with _lock:
        interceptor = _interceptors[-1] if _interceptors else None
    if interceptor is None:  # the last one left while this call was on its way
        return _original_enqueue(self, messages)
    interceptor(list(messages))
    return {}


def _intercepted_send_outboxed(self: Broker, messages: Sequence[TaskMessage]) -> list[int | Exception]:
    with _lock:
        interceptor = _interceptors[-1] if _interceptors else None
    if interceptor is None:
        return _original_send_outboxed(self, messages)
    interceptor(list(messages))
    return [OUTBOX_SENT] * len(messages)


def _announce_later(self: Broker, signatures: Iterable[tuple[str, str]]) -> None:
    """Nothing reaches Redis while tasks are intercepted: the signatures wait for a real enqueue."""
    give_back_unannounced(list(signatures))


@contextmanager
def intercept_enqueues(interceptor: Interceptor) -> Iterator[None]:
    """Hand every enqueue (of any broker, from any thread) to `interceptor` instead of Redis.

    `TaskType.enqueue`, `enqueue_many`, `enqueue_on_commit` (once the transaction commits,
    through `Broker.send_outboxed`) and the `django.tasks` backend all send their messages
    through this seam. Interceptors nest: the innermost one gets the messages.
    """
    with _lock:
        if not _interceptors:
            Broker.enqueue = _intercepted_enqueue  # type: ignore[method-assign]
            Broker.send_outboxed = _intercepted_send_outboxed  # type: ignore[method-assign]
            Broker.announce_signatures = _announce_later  # type: ignore[method-assign]
        _interceptors.append(interceptor)
    try:
        yield
    finally:
        with _lock:
            _interceptors.remove(interceptor)
            if not _interceptors:
                Broker.enqueue = _original_enqueue  # type: ignore[method-assign]
                Broker.send_outboxed = _original_send_outboxed  # type: ignore[method-assign]
                Broker.announce_signatures = _original_announce_signatures  # type: ignore[method-assign]

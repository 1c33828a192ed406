"""OpenTelemetry (the `otel` extra): the trace context a task carries, and a span per attempt."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .broker.attempt import error_text, format_traceback
from .conf import get_settings

if TYPE_CHECKING:
    from .broker.message import TaskMessage

#: The instrumentation scope of django-rtq's spans.
TRACER_NAME = "django_rtq"
#: The spans' `messaging.system`.
SYSTEM = "django_rtq"
#: The workflow node kinds whose children are nodes too, and where they are (canvas.py).
_CHILD_NODES = {"chain": ("steps",), "group": ("children",), "each": ("task",)}

#: What a finished attempt reports: its error, or None if it succeeded.
Finish = Callable[[BaseException | None], None]


@functools.cache
def _load() -> SimpleNamespace | None:
    """The OpenTelemetry API, imported on first use; None without the `otel` extra."""
    try:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    except ImportError:
        return None
    return SimpleNamespace(
        context=context,
        propagate=propagate,
        trace=trace,
        Link=Link,
        SpanKind=SpanKind,
        Status=Status,
        StatusCode=StatusCode,
    )


def api() -> SimpleNamespace | None:
    """The OpenTelemetry API if tracing is on (RTQ["TRACING"] not False, the extra installed)."""
    if get_settings().TRACING is False:
        return None
    return _load()


def _sending_api() -> SimpleNamespace | None:
    """The API if an enqueue now carries a trace context: a span is active, or RTQ["TRACING"]
    is True (an enqueue outside any span then starts a trace)."""
    otel = api()
    if otel is None:
        return None
    if get_settings().TRACING is True:
        return otel
    if not otel.context.get_current():  # an empty context, as outside any span: the quick answer
        return None
    return otel if otel.trace.get_current_span().get_span_context().is_valid else None


def carries_trace() -> bool:
    """Whether an enqueue now carries a trace context (`sending` has a span to make)."""
    return _sending_api() is not None


def _tracer(otel: SimpleNamespace) -> Any:
    return otel.trace.get_tracer(TRACER_NAME)


def _carrier(otel: SimpleNamespace) -> dict[str, str]:
    """The current context as the global propagator writes it (W3C traceparent by default)."""
    carrier: dict[str, str] = {}
    otel.propagate.inject(carrier)
    return carrier


@contextmanager
def sending(messages: Sequence[TaskMessage]) -> Iterator[Sequence[TaskMessage]]:
    """Around an enqueue: a PRODUCER span "send <task>" (one for the batch), whose context the
    messages given back carry. Without tracing, or outside a span (unless RTQ["TRACING"] is
    True), the messages themselves."""
    otel = _sending_api() if messages else None
    if otel is None:
        yield messages
        return
    first = messages[0]
    single = all(m.task == first.task for m in messages)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": first.queue,
        "rtq.task": first.task if single else "",
    }
    if len(messages) == 1:
        attributes["messaging.message.id"] = first.id
    else:
        attributes["messaging.batch.message_count"] = len(messages)
    name = f"send {first.task if single else first.queue}"
    kind = otel.SpanKind.PRODUCER
    with _tracer(otel).start_as_current_span(name, kind=kind, attributes=attributes):
        carrier = _carrier(otel)
        if not carrier:  # no tracer provider, and a trace to start (TRACING True): none to carry
            yield messages
            return
        yield [m if m.trace is not None else replace(m, trace=carrier) for m in messages]


@contextmanager
def sending_workflow(node: dict[str, Any], workflow_id: str) -> Iterator[dict[str, Any]]:
    """Around a workflow's start: a PRODUCER span "send <kind>", whose context each of its
    nodes given back carries (planner.py puts it in their messages)."""
    otel = _sending_api()
    if otel is None:
        yield node
        return
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": node.get("queue") or "",
        "messaging.message.id": workflow_id,
        "rtq.task": f"workflow.{node.get('t')}",
    }
    kind = otel.SpanKind.PRODUCER
    with _tracer(otel).start_as_current_span(f"send {node.get('t')}", kind=kind, attributes=attributes):
        carrier = _carrier(otel)
        yield _stamped(node, carrier) if carrier else node


def stamp_node(node: dict[str, Any]) -> dict[str, Any]:
    """A workflow node made while a span is active (an iterator's children, in its step's
    attempt) with that span's context; the node itself otherwise."""
    otel = _sending_api()
    carrier = _carrier(otel) if otel is not None else None
    return _stamped(node, carrier) if carrier else node


def _stamped(node: dict[str, Any], carrier: dict[str, str]) -> dict[str, Any]:
    """The node and the nodes under it, each with the trace carrier (a node's arguments are
    the caller's and are left alone)."""
    if not isinstance(node, dict) or "trace" in node:
        return node
    stamped = {**node, "trace": carrier}
    for key in _CHILD_NODES.get(node.get("t"), ()):
        children = node.get(key)
        if isinstance(children, list):
            stamped[key] = [_stamped(child, carrier) for child in children]
        elif isinstance(children, dict):
            stamped[key] = _stamped(children, carrier)
    return stamped


def node_trace(node: dict[str, Any]) -> dict[str, str] | None:
    """The trace carrier a planned node's message carries (see _stamped), if any."""
    trace = node.get("trace")
    return trace if isinstance(trace, dict) and trace else None


def attempt(
    message: TaskMessage, *, queue: str, number: int, worker_id: str
) -> AbstractContextManager[Finish]:
    """Around one attempt: a CONSUMER span "run <task>", the child of (and linked to) the
    context the message carries, or a root span if it carries none; current while the handler
    runs. Gives `finish(error)`: the outcome, an error's status and event. With no span to make,
    a context that does nothing (no generator of its own: this is on every task's path)."""
    otel = api()
    if otel is None or (not message.trace and _records_nothing(otel)):
        return _NO_SPAN
    return _attempt_span(otel, message, queue=queue, number=number, worker_id=worker_id)


@contextmanager
def _attempt_span(
    otel: SimpleNamespace, message: TaskMessage, *, queue: str, number: int, worker_id: str
) -> Iterator[Finish]:
    parent = otel.context.Context()  # a root span unless the message carries a context
    links = []
    if message.trace:
        parent = otel.propagate.extract(message.trace, context=parent)
        sent = otel.trace.get_current_span(parent).get_span_context()
        if sent.is_valid:
            links.append(otel.Link(sent))
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": queue,
        "messaging.message.id": message.id,
        "rtq.task": message.task,
        "rtq.attempt": number,
        "rtq.worker.id": worker_id,
    }
    span = _tracer(otel).start_span(
        f"run {message.task}",
        context=parent,
        kind=otel.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
    )

    def finish(error: BaseException | None) -> None:
        if error is None:
            span.set_attribute("rtq.outcome", "succeeded")
            return
        span.set_attribute("rtq.outcome", "failed")
        # The event record_exception() makes, from the texts that cannot raise: the handler's
        # error may be one whose str() or traceback formatting raises (broker/attempt.py).
        message = error_text(error)
        span.add_event(
            "exception",
            {
                "exception.type": type(error).__name__,
                "exception.message": message,
                "exception.stacktrace": format_traceback(error),
            },
        )
        span.set_status(otel.Status(otel.StatusCode.ERROR, f"{type(error).__name__}: {message}"))

    token = otel.context.attach(otel.trace.set_span_in_context(span, parent))
    try:
        yield finish
    finally:
        otel.context.detach(token)
        span.end()


def _no_finish(error: BaseException | None) -> None:
    pass


#: The context of an attempt without a span.
_NO_SPAN = nullcontext(_no_finish)


def _records_nothing(otel: SimpleNamespace) -> bool:
    """Whether no OpenTelemetry SDK is set up in this process (the API alone, whose global
    provider is still its proxy): a span would then record nothing. An attempt with no trace
    context to continue then skips its span, which costs a worker about 30 µs a task."""
    return isinstance(otel.trace.get_tracer_provider(), otel.trace.ProxyTracerProvider)

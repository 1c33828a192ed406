"""OpenTelemetry's SDK for the tests: one tracer provider for the process, its finished spans in memory."""

from __future__ import annotations

import functools

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@functools.cache
def span_exporter() -> InMemorySpanExporter:
    """The exporter every finished span of the process goes to (the global tracer provider can
    be set only once: it is set here, the first time)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def finished(name: str) -> list[ReadableSpan]:
    """The finished spans named `name`, oldest first."""
    return [span for span in span_exporter().get_finished_spans() if span.name == name]

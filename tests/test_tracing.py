"""OpenTelemetry (django_rtq/tracing.py): a task carries the trace context of its enqueue, through
the outbox and workflows, and each attempt on a real worker is a CONSUMER span in that trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import transaction
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from django_rtq import task
from django_rtq.broker import TaskState
from django_rtq.outbox import relay
from django_rtq.registry import announce_enqueued
from django_rtq.workflows import chain, iterator, map_reduce
from tests.support.outbox import make_due
from tests.support.polling import wait_for
from tests.support.tracing import finished, span_exporter
from tests.testapp import tasks, wf_tasks

ADD = "run tests.testapp.tasks.add"


@pytest.fixture
def spans():
    exporter = span_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def tracer(spans):
    return trace.get_tracer("tests")


def stored(redis_client, broker, task_id: str) -> dict:
    """The task's message as stored."""
    return json.loads(redis_client.hget(broker.queue("default").msg, task_id))


def the_span(name: str):
    [span] = wait_for(lambda: finished(name), message=f"the span {name!r}")
    return span


def check_run_of(run, sent, task_id: str) -> None:
    """`run` is the CONSUMER span of the task's first attempt, the child of and linked to `sent`."""
    assert run.kind == SpanKind.CONSUMER
    assert run.context.trace_id == sent.context.trace_id
    assert run.parent.span_id == sent.context.span_id
    assert [link.context.span_id for link in run.links] == [sent.context.span_id]
    assert run.attributes["messaging.message.id"] == task_id
    assert run.attributes["messaging.destination.name"] == "default"
    assert run.attributes["rtq.attempt"] == 1


def test_an_attempt_is_a_consumer_span_in_the_trace_of_the_enqueue(broker, tracer, run_worker, redis_client):
    with tracer.start_as_current_span("request") as request:
        task_id = tasks.add.enqueue(1, 2).id
    message = stored(redis_client, broker, task_id)
    assert message["v"] == 2 and message["trace"]["traceparent"].startswith("00-")

    with run_worker(queues={"default": 1}):
        run = the_span(ADD)
    sent = the_span("send tests.testapp.tasks.add")
    assert sent.kind == SpanKind.PRODUCER
    assert sent.parent.span_id == request.get_span_context().span_id
    assert dict(sent.attributes) == {
        "messaging.system": "django_rtq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "default",
        "messaging.message.id": task_id,
        "rtq.task": "tests.testapp.tasks.add",
    }
    check_run_of(run, sent, task_id)
    assert run.attributes["messaging.system"] == "django_rtq"
    assert run.attributes["messaging.operation.type"] == "process"
    assert run.attributes["rtq.task"] == "tests.testapp.tasks.add"
    assert run.attributes["rtq.outcome"] == "succeeded"
    assert run.status.status_code == StatusCode.UNSET


@task
def starts_a_span(name: str) -> None:
    with trace.get_tracer("tests").start_as_current_span(f"inside {name}"):
        pass


@task
async def starts_a_span_async(name: str) -> None:
    with trace.get_tracer("tests").start_as_current_span(f"inside {name}"):
        pass


def test_the_handler_runs_inside_its_attempt_span(tracer, run_worker):
    """A span the handler starts, sync or async, is a child of the attempt's."""
    with tracer.start_as_current_span("request"):
        starts_a_span.enqueue("sync")
        starts_a_span_async.enqueue("async")

    with run_worker(queues={"default": 2}):
        runs = [the_span(f"run {starts_a_span.name}"), the_span(f"run {starts_a_span_async.name}")]
    for run, name in zip(runs, ("sync", "async"), strict=True):
        inside = the_span(f"inside {name}")
        assert inside.parent.span_id == run.context.span_id
        assert inside.context.trace_id == run.context.trace_id


def test_a_task_sent_by_the_outbox_relay_carries_the_context_of_its_enqueue(
    broker, tracer, redis_away, run_worker, redis_client, transactional_db
):
    from django_rtq.models import OutboxTask

    with tracer.start_as_current_span("request"), transaction.atomic():
        task_id = tasks.add.enqueue_on_commit(1, 2).id
    # Redis was away at the commit: the row waits in the outbox, the context in its message.
    kept = json.loads(OutboxTask.objects.get(task_id=task_id).message)["trace"]
    assert redis_away() is not None  # Redis is back
    make_due()
    assert relay(broker, using="default", announce=announce_enqueued) == 1
    assert stored(redis_client, broker, task_id)["trace"] == kept

    with run_worker(queues={"default": 1}):
        run = the_span(ADD)
    check_run_of(run, the_span("send tests.testapp.tasks.add"), task_id)


def test_the_children_of_a_workflow_run_in_the_trace_of_its_enqueue(broker, inspector, tracer, run_worker):
    with tracer.start_as_current_span("request"):
        workflow_id = chain(wf_tasks.add.s(1, 2), wf_tasks.mul.s(10), retention=60).enqueue()
    with run_worker(queues={"default": 1}):
        wait_for(lambda: inspector.get_task(workflow_id).state == TaskState.COMPLETED, message="the chain")
        first, second = the_span("run tests.testapp.wf_tasks.add"), the_span("run tests.testapp.wf_tasks.mul")
    sent = the_span("send chain")
    assert sent.kind == SpanKind.PRODUCER
    assert sent.attributes["messaging.message.id"] == workflow_id
    for run in (first, second):  # the second step is planned by a worker, after the first ran
        assert run.kind == SpanKind.CONSUMER
        assert run.context.trace_id == sent.context.trace_id
        assert run.parent.span_id == sent.context.span_id


def test_map_reduce_chunks_and_an_iterators_children_run_in_the_trace_of_its_enqueue(
    inspector, tracer, run_worker
):
    """Children made at run time: a map step's chunks, and the children an iterator's function
    returns (stamped with its step's attempt context)."""
    with tracer.start_as_current_span("request"):
        mapped = map_reduce(
            wf_tasks.split.s(30, 10), wf_tasks.chunk_sum.s(), wf_tasks.total.s(), retention=60
        ).enqueue()
        iterated = iterator(
            wf_tasks.numbers, {"next": 0, "limit": 5, "name": "traced"}, retention=60
        ).enqueue()
    with run_worker(queues={"default": 2}):
        for workflow_id in (mapped, iterated):
            wait_for(lambda w=workflow_id: inspector.get_task(w).state == TaskState.COMPLETED, message="done")
    [request] = finished("request")
    runs = [span for span in span_exporter().get_finished_spans() if span.name.startswith("run ")]
    names = [run.name.removeprefix("run tests.testapp.wf_tasks.") for run in runs]
    assert sorted(names).count("chunk_sum") == 3 and sorted(names).count("mark") == 5, names
    assert {run.context.trace_id for run in runs} == {request.context.trace_id}


def test_a_failed_attempt_has_an_error_status_and_its_exception(tracer, run_worker):
    with tracer.start_as_current_span("request"):
        task_id = tasks.always_fails.using(max_retries=0).enqueue("traced").id
    with run_worker(queues={"default": 1}):
        run = the_span("run tests.testapp.tasks.always_fails")
    assert run.attributes["messaging.message.id"] == task_id
    assert run.attributes["rtq.outcome"] == "failed"
    assert run.status.status_code == StatusCode.ERROR
    assert run.status.description == "ValueError: this task always fails"
    [event] = run.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "this task always fails"


@pytest.mark.parametrize("kind", sorted(tasks.ODD_ERRORS))
def test_an_odd_error_is_traced_with_its_stand_in_texts_and_archives_its_task_once(
    kind, tracer, run_worker, inspector
):
    """An error whose str() or traceback formatting raises: the span gets the texts that cannot
    raise (broker/attempt.py), and the attempt is settled as any failure."""
    with tracer.start_as_current_span("request"):
        task_id = tasks.raises_odd.enqueue(f"traced-{kind}", kind).id
    with run_worker(queues={"default": 1}):
        run = the_span("run tests.testapp.tasks.raises_odd")
        wait_for(lambda: inspector.get_task(task_id).state == TaskState.ARCHIVED, message="archived")
    assert run.status.status_code == StatusCode.ERROR
    [event] = run.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == tasks.ODD_ERRORS[kind].__name__
    assert "Traceback (most recent call last)" in event.attributes["exception.stacktrace"]


def test_a_retry_is_another_attempt_span_of_the_same_trace(tracer, run_worker, settings):
    settings.RTQ = {**settings.RTQ, "RETRY_BACKOFF": lambda retried, exc: 0}
    with tracer.start_as_current_span("request"):
        tasks.flaky.enqueue("traced-retry", 1)
    with run_worker(queues={"default": 1}):
        runs = wait_for(lambda: len(spans := finished("run tests.testapp.tasks.flaky")) == 2 and spans)
    assert [run.attributes["rtq.attempt"] for run in runs] == [1, 2]
    assert [run.attributes["rtq.outcome"] for run in runs] == ["failed", "succeeded"]
    assert runs[0].parent.span_id == runs[1].parent.span_id


def test_without_an_active_span_the_message_carries_nothing_and_the_attempt_is_a_root(
    broker, spans, run_worker, redis_client
):
    task_id = tasks.add.enqueue(1, 2).id
    assert set(stored(redis_client, broker, task_id)) >= {"task", "args"}
    assert "v" not in stored(redis_client, broker, task_id) and "trace" not in stored(
        redis_client, broker, task_id
    )  # format 1
    with run_worker(queues={"default": 1}):
        run = the_span(ADD)
    assert run.parent is None and list(run.links) == []
    assert run.attributes["messaging.message.id"] == task_id
    assert finished("send tests.testapp.tasks.add") == []


def test_a_context_with_baggage_but_no_span_carries_nothing(broker, spans, redis_client):
    """A context that is not empty yet holds no span (baggage only) takes the full check, not
    the quick answer for an empty one, and carries nothing either."""
    from opentelemetry import baggage, context

    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        assert context.get_current()  # not the empty context of the quick answer
        task_id = tasks.add.enqueue(1, 2).id
    finally:
        context.detach(token)
    assert "trace" not in stored(redis_client, broker, task_id)
    assert finished("send tests.testapp.tasks.add") == []


def test_an_enqueue_inside_a_span_carries_it_after_one_outside_any(broker, spans, tracer, redis_client):
    outside = tasks.add.enqueue(1, 2).id
    with tracer.start_as_current_span("request") as request:
        inside = tasks.add.enqueue(1, 2).id
    assert "trace" not in stored(redis_client, broker, outside)
    sent = the_span("send tests.testapp.tasks.add")
    assert sent.context.trace_id == request.get_span_context().trace_id
    assert stored(redis_client, broker, inside)["trace"]["traceparent"].split("-")[1] == (
        f"{request.get_span_context().trace_id:032x}"
    )


def test_tracing_true_starts_a_trace_at_an_enqueue_outside_any_span(broker, spans, settings, redis_client):
    settings.RTQ = {**settings.RTQ, "TRACING": True}
    task_id = tasks.add.enqueue(1, 2).id
    sent = the_span("send tests.testapp.tasks.add")
    assert sent.parent is None
    assert (
        stored(redis_client, broker, task_id)["trace"]["traceparent"].split("-")[2]
        == f"{sent.context.span_id:016x}"
    )


def test_tracing_false_carries_nothing_and_makes_no_span(
    broker, inspector, tracer, settings, run_worker, redis_client
):
    settings.RTQ = {**settings.RTQ, "TRACING": False}
    with tracer.start_as_current_span("request"):
        task_id = tasks.add.enqueue(1, 2).id
    assert "trace" not in stored(redis_client, broker, task_id)
    with run_worker(queues={"default": 1}):
        wait_for(lambda: inspector.get_task(task_id).state == TaskState.COMPLETED, message="the task")
    assert [span.name for span in span_exporter().get_finished_spans()] == ["request"]


def test_tracing_takes_only_none_true_or_false(settings):
    from django.core.exceptions import ImproperlyConfigured

    from django_rtq.conf import get_settings

    settings.RTQ = {**settings.RTQ, "TRACING": 1}
    with pytest.raises(ImproperlyConfigured, match="TRACING"):
        get_settings()


def test_an_attempt_with_no_trace_to_continue_makes_no_span_while_no_sdk_is_set_up(monkeypatch):
    """With OpenTelemetry's API and no SDK (its global provider still the proxy), a span records
    nothing: an attempt whose message carries no trace context makes none (it cost a worker about
    30 µs a task); one that carries a context still makes its span, current in the handler."""
    from opentelemetry.trace import ProxyTracerProvider

    from django_rtq import tracing
    from django_rtq.broker import TaskMessage

    monkeypatch.setattr(trace, "get_tracer_provider", ProxyTracerProvider)
    started = []
    tracer = tracing._tracer(tracing.api())

    class CountingTracer:
        def start_span(self, name, **kwargs):
            started.append(name)
            return tracer.start_span(name, **kwargs)

    monkeypatch.setattr(tracing, "_tracer", lambda otel: CountingTracer())
    plain = TaskMessage(id="t1", task="x", queue="default")
    with tracing.attempt(plain, queue="default", number=1, worker_id="w") as finish:
        finish(None)
    assert started == []
    parent = {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}
    traced = TaskMessage(id="t2", task="x", queue="default", trace=parent)
    with tracing.attempt(traced, queue="default", number=1, worker_id="w") as finish:
        assert trace.get_current_span().get_span_context().trace_id == int("1" * 32, 16)
        finish(None)
    assert started == ["run x"]


WITHOUT_OTEL = """
import sys

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoOpenTelemetry())
import django
django.setup()
from django_rtq import tracing
from django_rtq.broker import TaskMessage
from django_rtq.worker.processor import executor

message = TaskMessage(id="t1", task="x", queue="default")
with tracing.sending([message]) as sent:
    assert list(sent) == [message]
with tracing.attempt(message, queue="default", number=1, worker_id="w") as finish:
    finish(ValueError("x"))
assert tracing.stamp_node({"t": "task"}) == {"t": "task"}
assert not [name for name in sys.modules if name.startswith("opentelemetry")], "imported"
print("ok")
"""


def test_without_the_extra_nothing_changes_and_nothing_of_it_is_imported():
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL], env=env, cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr

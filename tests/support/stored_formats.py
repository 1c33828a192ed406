"""The golden fixtures of the stored formats (tests/data/formats/): each stored shape of this
release built with the current writers on a fixed clock, dumped as the raw Redis keys it
touches, and loaded back for a worker to run.

Regenerate (the shapes a new version added or changed, into its directory: the fixtures of an
older version are never edited, and keep the shapes the new one left as they were):

    DJANGO_SETTINGS_MODULE=tests.settings RTQ_REDIS_URL=redis://... python -m tests.support.stored_formats
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

from django_rtq.broker import Broker, Completion, TaskMessage, TaskState, manual
from django_rtq.broker.attempt import AttemptInfo
from django_rtq.broker.checkpoint import save_checkpoint
from django_rtq.broker.message import child_notice
from django_rtq.broker.snoozing import snooze
from django_rtq.broker.versions import INFO_FORMAT, MESSAGE_FORMAT, WORKFLOW_FORMAT
from django_rtq.registry import find_task_type
from django_rtq.workflows import apply_due, chain, chord, group, iterator, map_reduce
from django_rtq.workflows.planner import dumps
from tests.support.clock import FakeClock

#: Where the fixtures are: one directory per set of format versions (v1, v2, ...).
FORMATS_DIR = Path(__file__).resolve().parents[1] / "data" / "formats"
#: The key prefix the fixtures' key names are written with.
PREFIX = "rtq"
WORKER = "worker-1"
QUEUE = "default"
#: Seconds finished tasks and workflows of the fixtures are kept.
KEEP = 3600
#: The arguments of the plain message: every JSON type, nested.
ARGS = [1, -2.5, "text é ✓", True, None, [1, [2, []]], {"a": {"b": [None, False]}}]
KWARGS = {"n": 0, "f": 1e-9, "s": "", "l": [], "d": {}, "b": False, "z": None, "big": 2**53}
#: The W3C traceparent of the traced message's span.
TRACE_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACEBACK = "Traceback (most recent call last):\n  ...\nRuntimeError: a failure of the fixture\n"


def current_formats() -> dict[str, int]:
    return {"message": MESSAGE_FORMAT, "info": INFO_FORMAT, "workflow": WORKFLOW_FORMAT}


def version_dirs() -> list[Path]:
    """The fixtures' directories, oldest first."""
    return sorted(FORMATS_DIR.glob("v*/"), key=lambda path: int(path.name[1:]))


def current_dir() -> Path | None:
    """The directory of the fixtures of this release's formats (the newest); None if there is
    none yet."""
    directories = version_dirs()
    if directories and json.loads((directories[-1] / "formats.json").read_text()) == current_formats():
        return directories[-1]
    return None


def newest_fixture(name: str) -> Path | None:
    """The newest fixture of the shape `name`: a version's directory holds the shapes that
    version added or changed, the older ones hold the rest."""
    for directory in reversed(version_dirs()):
        path = directory / f"{name}.json"
        if path.exists():
            return path
    return None


def read_keys(client: Any, prefix: str) -> dict[str, dict[str, Any]]:
    """Every key whose name starts with `prefix`, with its type, what it holds, and its TTL
    (whole seconds, rounded up) if it has one."""
    keys = {}
    for key in sorted(client.scan_iter(f"{prefix}*", count=1000)):
        kind = client.type(key)
        if kind == "hash":
            value: Any = dict(sorted(client.hgetall(key).items()))
        elif kind == "zset":
            value = [[member, score] for member, score in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        else:
            value = client.get(key)
        keys[key] = {"type": kind, "value": value}
        ttl = client.pttl(key)
        if ttl > 0:
            keys[key]["ttl"] = math.ceil(ttl / 1000)
    return keys


def load_keys(client: Any, prefix: str, keys: dict[str, dict[str, Any]]) -> None:
    """Write a fixture's keys under `prefix` (for PREFIX), merged into what is there: fixtures
    of other shapes may share a queue's keys (their ids differ); a counter keeps the larger."""
    for name, key in keys.items():
        target = prefix + name.removeprefix(PREFIX)
        kind, value = key["type"], key["value"]
        if kind == "hash":
            client.hset(target, mapping=value)
        elif kind == "zset":
            client.zadd(target, dict(value))
        elif kind == "set":
            client.sadd(target, *value)
        elif kind == "list":
            client.rpush(target, *value)
        else:
            old = client.get(target)
            if old is not None and old.isdigit() and value.isdigit():
                value = str(max(int(old), int(value)))
            client.set(target, value)
        if "ttl" in key:
            client.expire(target, key["ttl"])


# Building the shapes


class Builder:
    """Builds shapes on a broker whose clock stands still, as a worker's writers would."""

    def __init__(self, broker: Broker, clock: FakeClock) -> None:
        self.broker = broker
        self.clock = clock

    def run(
        self, count: int = 1, *, result: Any = None, error: bool = False, retry_in: float = 60
    ) -> list[str]:
        """Claim the next `count` pending tasks and settle them as the settler does: a success
        (its result the handler's, or `result`), or a failure (retried if it has retries left)."""
        claimed = self.broker.claim(QUEUE, worker_id=WORKER, limit=count)
        for task in claimed:
            message = TaskMessage.from_json(task.raw_message, id=task.id, queue=QUEUE)
            facts = AttemptInfo.from_mapping(task.info)
            started = self.clock()
            self.clock.advance(1)
            if error:
                self._fail(task, message, facts, started, retry_in)
            else:
                value = result if result is not None else _handler_result(message)
                self._complete(task, message, facts, started, dumps(value))
        return [task.id for task in claimed]

    def _complete(
        self, task: Any, message: TaskMessage, facts: AttemptInfo, started: float, result: str
    ) -> None:
        info, times = {}, None
        if not message.retention:
            pass
        elif facts.stored:
            info = facts.succeeded(WORKER, started, self.clock())
        else:
            times = (started, self.clock())
        done = Completion(
            id=task.id,
            run=task.run,
            info=info,
            times=times,
            result_json=result,
            retention_ms=int(message.retention * 1000),
            unique_key=message.unique_key,
            notify=child_notice(message),
        )
        assert self.broker.complete(QUEUE, [done], worker_id=WORKER) == 1

    def _fail(
        self, task: Any, message: TaskMessage, facts: AttemptInfo, started: float, retry_in: float
    ) -> None:
        retrying = facts.retried < message.max_retries
        error = RuntimeError("a failure of the fixture")
        info = facts.failed(
            error, TRACEBACK, worker_id=WORKER, started_at=started, failed_at=self.clock(), retrying=retrying
        )
        assert self.broker.fail(
            QUEUE,
            task.id,
            worker_id=WORKER,
            run=task.run,
            to=TaskState.RETRY if retrying else TaskState.ARCHIVED,
            retry_at_ms=self.clock.ms(retry_in),
            info=info,
            unique_key=message.unique_key,
        )

    def apply(self) -> None:
        """Apply the due commands, as a commander does."""
        apply_due(self.broker, [QUEUE])


def _handler_result(message: TaskMessage) -> Any:
    task_type = find_task_type(message.task)
    assert task_type is not None, message.task
    return task_type.func(*message.args, **message.kwargs)


@dataclass(frozen=True)
class Shape:
    """A stored shape: `build` makes it and returns what the fixture expects of it: `stored`
    (id -> what the Inspector reads of it as stored) and `ran` (id -> what it is once a worker
    ran it: state, result, info facts, or `reported` by stored_shape when it is gone), and
    `run_now` (archived ids to run again by hand first)."""

    name: str
    about: str
    build: Callable[[Builder], dict[str, Any]]


def _stored_shape():
    from tests.testapp.tasks import stored_shape

    return stored_shape


def _reported(args: list[Any] | None = None, kwargs: dict[str, Any] | None = None, retried: int = 0) -> dict:
    return {"args": args or [], "kwargs": kwargs or {}, "retried": retried}


def _message(
    name: str, about: str, options: dict[str, Any], *, plain: bool = False, traced: bool = False
) -> Shape:
    task_id = f"msg-{name}"

    def build(b: Builder) -> dict[str, Any]:
        args, kwargs = (ARGS, KWARGS) if plain else ([name], {})
        with _in_span() if traced else nullcontext():
            _stored_shape().using(task_id=task_id, **options).enqueue(*args, **kwargs)
        expected = _reported(args, kwargs)
        if options.get("retention"):
            ran = {"state": TaskState.COMPLETED, "result": expected}
        else:
            ran = {"state": None, "reported": expected}
        return {"ran": {task_id: ran}}

    return Shape(f"message_{name}", about, build)


def _partitioned(b: Builder) -> dict[str, Any]:
    """Pending tasks of two partitions, one of them weighted, in their partitions' turns (the
    queue's lanes and virtual clock): format 4."""
    stored_shape = _stored_shape()
    weighted = replace(
        stored_shape, options={**stored_shape.options, "partition_limits": {"acme": {"weight": 2}}}
    )
    weighted.using(task_id="msg-partitioned", partition="acme").enqueue("partitioned")
    stored_shape.using(task_id="msg-partitioned-plain", partition="globex").enqueue("partitioned-plain")
    return {
        "ran": {
            "msg-partitioned": {"state": None, "reported": _reported(["partitioned"], {})},
            "msg-partitioned-plain": {"state": None, "reported": _reported(["partitioned-plain"], {})},
        }
    }


def _debounced(b: Builder) -> dict[str, Any]:
    """A debounced copy that waits, an enqueue merged into it (its newest arguments, its count
    of merges, its debounce key with the window's TTL): format 3."""
    debounced = _stored_shape().using(debounce=60, debounce_key="reindex:42")
    debounced.using(task_id="msg-debounced").enqueue("debounced-first")
    b.clock.advance(1)
    debounced.using(task_id="msg-debounced-merged").enqueue("debounced")
    return {"ran": {"msg-debounced": {"state": None, "reported": _reported(["debounced"])}}}


def _workflow(
    name: str, about: str, make: Callable[[], Any], result: Any, steps: Callable[[Builder], None]
) -> Shape:
    workflow_id = f"wf-{name}"

    def build(b: Builder) -> dict[str, Any]:
        make().enqueue(workflow_id=workflow_id)
        steps(b)
        return {"ran": {workflow_id: {"state": TaskState.COMPLETED, "result": result}}}

    return Shape(f"workflow_{name}", about, build)


@contextmanager
def _in_span() -> Iterator[None]:
    """Enqueue inside a span of fixed ids (TRACE_PARENT), whose context the message carries as
    it is (no span of django-rtq's own: its ids would be random)."""
    from opentelemetry import trace

    ids = TRACE_PARENT.split("-")
    parent = trace.SpanContext(
        trace_id=int(ids[1], 16), span_id=int(ids[2], 16), is_remote=False, trace_flags=trace.TraceFlags(1)
    )
    with (
        mock.patch("django_rtq.tracing._tracer", lambda otel: trace.NoOpTracer()),
        trace.use_span(trace.NonRecordingSpan(parent)),
    ):
        yield


def _info_task(b: Builder, name: str) -> str:
    """Enqueue the task of an info shape (kept when it succeeds, one retry); return its id."""
    return _stored_shape().using(task_id=f"info-{name}", retention=KEEP, max_retries=1).enqueue(name).id


def _info_succeeded(b: Builder) -> dict[str, Any]:
    task_id = _info_task(b, "succeeded")
    b.run(result=_reported(["succeeded"]))
    return {"stored": {task_id: {"state": TaskState.COMPLETED, "result": _reported(["succeeded"])}}}


def _info_succeeded_after_a_retry(b: Builder) -> dict[str, Any]:
    task_id = _info_task(b, "succeeded_after_a_retry")
    b.run(error=True)
    b.clock.advance(61)
    b.broker.forward(QUEUE)
    b.run(result=_reported(["succeeded_after_a_retry"], retried=1))
    stored = {"state": TaskState.COMPLETED, "retried": 1, "errors": 1}
    return {"stored": {task_id: stored}}


def _info_retrying(b: Builder) -> dict[str, Any]:
    task_id = _info_task(b, "retrying")
    b.run(error=True)
    ran = {
        "state": TaskState.COMPLETED,
        "result": _reported(["retrying"], retried=1),
        "retried": 1,
        "errors": 1,
    }
    return {"stored": {task_id: {"state": TaskState.RETRY, "retried": 1, "errors": 1}}, "ran": {task_id: ran}}


def _info_snoozed(b: Builder) -> dict[str, Any]:
    """Its handler snoozed it (no attempt counted), holding its type: format 2 of the info."""
    task_id = _info_task(b, "snoozed")
    (claimed,) = b.broker.claim(QUEUE, worker_id=WORKER, limit=1)
    info = AttemptInfo.from_mapping(claimed.info).snoozing(b.clock())
    due = snooze(
        b.broker, QUEUE, task_id, worker_id=WORKER, run=claimed.run, delay_ms=60_000, info=info,
        hold_task="tests.testapp.tasks.stored_shape",
    )  # fmt: skip
    assert due == b.clock.ms(60)
    ran = {"state": TaskState.COMPLETED, "result": _reported(["snoozed"]), "snoozed": 1, "v": 2}
    return {"stored": {task_id: {"state": TaskState.SCHEDULED, "snoozed": 1, "v": 2}}, "ran": {task_id: ran}}


def _info_archived_after_failures(b: Builder) -> dict[str, Any]:
    task_id = _info_task(b, "archived_after_failures")
    b.run(error=True)
    b.clock.advance(61)
    b.broker.forward(QUEUE)
    b.run(error=True)
    ran = {"state": TaskState.COMPLETED, "result": _reported(["archived_after_failures"], retried=1)}
    return {
        "stored": {task_id: {"state": TaskState.ARCHIVED, "retried": 1, "errors": 2}},
        "run_now": [task_id],
        "ran": {task_id: ran},
    }


def _taken_back(b: Builder, name: str, *, started: bool) -> dict[str, Any]:
    """A task whose worker died: recovered once if it had started, requeued once if not."""
    task_id = _info_task(b, name)
    b.broker.claim(QUEUE, worker_id=WORKER, limit=1, start_now=1 if started else 0)
    b.clock.advance(b.broker.lease_ms / 1000 + 1)
    count = "recovered" if started else "requeued"
    assert b.broker.recover(QUEUE, grace_ms=0, max_recoveries=3) == [(task_id, count)]
    ran = {"state": TaskState.COMPLETED, "result": _reported([name]), count: 1}
    return {"stored": {task_id: {"state": TaskState.PENDING, count: 1}}, "ran": {task_id: ran}}


def _info_recovered(b: Builder) -> dict[str, Any]:
    return _taken_back(b, "recovered", started=True)


def _info_requeued_unstarted(b: Builder) -> dict[str, Any]:
    return _taken_back(b, "requeued_unstarted", started=False)


def _info_requeued_at_shutdown(b: Builder) -> dict[str, Any]:
    task_id = _info_task(b, "requeued_at_shutdown")
    b.broker.claim(QUEUE, worker_id=WORKER, limit=1)
    assert b.broker.requeue(QUEUE, [task_id], worker_id=WORKER) == 1
    ran = {"state": TaskState.COMPLETED, "result": _reported(["requeued_at_shutdown"])}
    return {"stored": {task_id: {"state": TaskState.PENDING}}, "ran": {task_id: ran}}


def _info_checkpoint(b: Builder) -> dict[str, Any]:
    task_id = _info_task(b, "checkpoint")
    (claimed,) = b.broker.claim(QUEUE, worker_id=WORKER, limit=1)
    assert save_checkpoint(
        b.broker, QUEUE, task_id, worker_id=WORKER, run=claimed.run, value_json='{"after":500}'
    )
    assert b.broker.requeue(QUEUE, [task_id], worker_id=WORKER) == 1
    ran = {"state": TaskState.COMPLETED, "result": _reported(["checkpoint"])}
    return {"stored": {task_id: {"state": TaskState.PENDING}}, "ran": {task_id: ran}}


def _info_archived_by_hand(b: Builder) -> dict[str, Any]:
    task_id = _info_task(b, "archived_by_hand")
    assert manual.archive(b.broker, QUEUE, [task_id]) == 1
    ran = {"state": TaskState.COMPLETED, "result": _reported(["archived_by_hand"])}
    return {"stored": {task_id: {"state": TaskState.ARCHIVED}}, "run_now": [task_id], "ran": {task_id: ran}}


def _wf_tasks():
    from tests.testapp import wf_tasks

    return wf_tasks


def _chain() -> Any:
    t = _wf_tasks()
    return chain(t.add.s(2, 3), t.mul.s(10), t.add.s(1), retention=KEEP)


def _group() -> Any:
    t = _wf_tasks()
    return group(t.add.s(1, 1), t.add.s(2, 2), t.add.s(3, 3), retention=KEEP)


def _chord() -> Any:
    t = _wf_tasks()
    return chord([t.add.s(i, 1) for i in range(3)], t.total.s(), retention=KEEP)


def _nested() -> Any:
    t = _wf_tasks()
    return group(chain(t.add.s(1, 1), t.mul.s(2)), t.add.s(5, 5), retention=KEEP)


def _map_reduce() -> Any:
    t = _wf_tasks()
    return map_reduce(t.split.s(30, 10), t.total.s(), t.total.s(), retention=KEEP)


def _iterator() -> Any:
    t = _wf_tasks()
    return iterator(t.numbers, {"next": 0, "limit": 25, "name": "stored-formats"}, window=10, retention=KEEP)


def _postponed() -> Any:
    t = _wf_tasks()
    return chain(t.add.s(1, 2), t.mul.s(3), retention=KEEP).using(delay=60)


def _run_and_apply(count: int) -> Callable[[Builder], None]:
    def steps(b: Builder) -> None:
        for _ in range(count):
            b.run()
            b.apply()

    return steps


def _chain_steps(b: Builder) -> None:
    b.run()
    b.apply()
    b.run()  # the second step's outcome: a command not applied yet


SHAPES: tuple[Shape, ...] = (
    _message("plain", "a message with arguments of every JSON type and no option", {}, plain=True),
    _message("priority", "a message with a priority", {"priority": 7}),
    _message("max_retries", "a message with retries", {"max_retries": 3}),
    _message("timeout", "a message with a timeout", {"timeout": 30}),
    _message("deadline", "a message with a deadline", {"deadline": datetime(2100, 1, 1, tzinfo=UTC)}),
    _message("retention", "a message kept once it succeeded", {"retention": KEEP}),
    _message("unique", "a unique message (its lock key, with a TTL)", {"unique": 600}),
    _message("unique_key", "a message unique by a key of its own", {"unique": 600, "unique_key": "order-42"}),
    _message("process_at", "a message scheduled at a time", {"process_at": FakeClock().now + 3600}),
    _message("delay", "a message scheduled after a delay", {"delay": 60}),
    _message("traced", "a message with the trace context of its enqueue (format 2)", {}, traced=True),
    Shape("message_debounced", "a debounced message that an enqueue was merged into (format 3)", _debounced),
    Shape("message_partitioned", "messages of two partitions, one weighted (format 4)", _partitioned),
    Shape("info_succeeded", "a first attempt succeeded, kept for its retention", _info_succeeded),
    Shape(
        "info_succeeded_after_a_retry", "succeeded on its second attempt, kept", _info_succeeded_after_a_retry
    ),
    Shape("info_retrying", "an attempt failed; it will retry", _info_retrying),
    Shape(
        "info_archived_after_failures",
        "archived once its retries were used up",
        _info_archived_after_failures,
    ),
    Shape("info_recovered", "taken back from a worker that died while it ran", _info_recovered),
    Shape(
        "info_requeued_unstarted",
        "taken back from a worker that died before it started",
        _info_requeued_unstarted,
    ),
    Shape("info_requeued_at_shutdown", "given back by a worker shutting down", _info_requeued_at_shutdown),
    Shape("info_archived_by_hand", "archived by hand while pending", _info_archived_by_hand),
    Shape("info_snoozed", "its handler snoozed it, holding its type (info format 2)", _info_snoozed),
    Shape(
        "info_checkpoint",
        "saved a checkpoint as it ran, then given back by a worker shutting down (info format 2)",
        _info_checkpoint,
    ),
    _workflow(
        "chain",
        "a chain: its first step done, its second's outcome not applied yet",
        _chain,
        51,
        _chain_steps,
    ),
    _workflow("group", "a group: one child done of three", _group, [2, 4, 6], _run_and_apply(1)),
    _workflow("chord", "a chord (a group, then a callback): one child done", _chord, 6, _run_and_apply(1)),
    _workflow("nested", "a group of a chain and a task: one task done", _nested, [4, 10], _run_and_apply(1)),
    _workflow("map_reduce_mapping", "a map/reduce in its mapping stage", _map_reduce, 435, lambda b: None),
    _workflow(
        "map_reduce_aggregating",
        "a map/reduce aggregating: one chunk done",
        _map_reduce,
        435,
        _run_and_apply(2),
    ),
    _workflow(
        "map_reduce_reducing", "a map/reduce reducing: every chunk done", _map_reduce, 435, _run_and_apply(4)
    ),
    _workflow(
        "iterator", "an iterator: its first step done, its children pending", _iterator, 25, _run_and_apply(1)
    ),
    _workflow("postponed", "a workflow postponed until its start time", _postponed, 9, lambda b: None),
)


@contextmanager
def _fixed_time(clock: FakeClock) -> Iterator[None]:
    with mock.patch("time.time", clock):
        yield


def build_shape(
    shape: Shape, client: Any, broker_for: Callable[[str], AbstractContextManager[Broker]]
) -> dict[str, Any]:
    """Build a shape under a key prefix of its own (`broker_for(prefix)`: the process's broker
    on it, while in the context), on a fixed clock; return its fixture: its keys under PREFIX
    and what it expects. Its keys are deleted."""
    prefix = f"rtqfmt-{uuid.uuid4().hex[:10]}"
    clock = FakeClock()
    with broker_for(prefix) as broker, _fixed_time(clock):
        broker.clock = clock
        expected = shape.build(Builder(broker, clock))
    keys = read_keys(client, f"{prefix}:")
    if keys:
        client.delete(*keys)
    text = json.dumps(keys)
    assert prefix not in text.replace(json.dumps(f"{prefix}:")[1:-1], ""), "a value names the key prefix"
    return {
        "shape": shape.name,
        "about": shape.about,
        "formats": current_formats(),
        "keys": {PREFIX + name.removeprefix(prefix): value for name, value in keys.items()},
        **json.loads(json.dumps(expected)),
    }


def write_fixture(path: Path, fixture: dict[str, Any]) -> None:
    path.write_text(json.dumps(fixture, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    """Write the fixtures of this release's formats into a new version's directory."""
    import django
    import redis
    from django.conf import settings
    from django.test import override_settings

    django.setup()
    from django_rtq.connection import get_broker, reset_broker

    client = redis.Redis.from_url(settings.RTQ["REDIS_URL"], decode_responses=True)

    @contextmanager
    def broker_for(prefix: str) -> Iterator[Broker]:
        with override_settings(RTQ={**settings.RTQ, "KEY_PREFIX": prefix}):
            reset_broker()
            yield get_broker()
        reset_broker()

    fixtures = []
    for shape in SHAPES:
        fixture = build_shape(shape, client, broker_for)
        path = newest_fixture(shape.name)
        if path is None or json.loads(path.read_text())["keys"] != fixture["keys"]:
            fixtures.append((fixture, path))
    target = current_dir()
    changed = [fixture["shape"] for fixture, path in fixtures if path is not None]
    if target is not None and changed:
        sys.exit(f"the writers changed the shapes {changed}: raise a format version to write them anew")
    if target is None:
        target = FORMATS_DIR / f"v{len(version_dirs()) + 1}"
        target.mkdir(parents=True)
        (target / "formats.json").write_text(json.dumps(current_formats()) + "\n")
    for fixture, _ in fixtures:
        write_fixture(target / f"{fixture['shape']}.json", fixture)
    print(f"wrote {len(fixtures)} fixtures into {target}")


if __name__ == "__main__":
    main()

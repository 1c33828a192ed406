"""Issue 10, malformed data: garbage in Redis never kills a worker, never sticks, never runs.

Data written straight into Redis under the test's prefix, as a buggy client, an old or newer
version of django-rtq, or a hand-edit could leave it:

- task messages (`rtq:{q}:msg`) that are not JSON, not an object, have unexpected or missing
  fields or fields of the wrong type, or are missing;
- task info (`rtq:{q}:info`) that is not JSON or has fields of the wrong type, on a pending
  task and on an active task whose lease expired (the recoverer's case);
- queue keys of the wrong Redis type (`info` a STRING instead of a HASH...);
- waiting workflows (`rtq:{q}:wf:<id>`) with missing or garbage fields, when a child finishes.

What is demanded of an in-process worker (`run_worker`) each time:

- every bad task ends archived with the reason in its info, or is dropped, and either way a
  WARNING (or worse) names it in the log; a task whose message is malformed never runs;
- nothing stays pending, active or in retry for good (a bad workflow does not stay waiting);
- no worker thread dies, and the worker keeps running good tasks at full concurrency
  (`CONCURRENCY` good tasks enqueued after the bad ones must run at the same time);
- with a wrong-typed key the worker logs the problem, keeps serving its other queues, and
  serves the broken queue again once the key is repaired.

Each category has a catalogue test (every case listed in the issue, in one worker run, with
a report of each case that went wrong) and a hypothesis test exploring variations.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from django_rtq.broker import Broker
from django_rtq.broker.claims import PARKED_BASE
from django_rtq.broker.message import TaskMessage
from django_rtq.broker.versions import MESSAGE_FORMAT
from django_rtq.conf import get_settings
from django_rtq.worker.processor.watchdog import SHUTDOWN_STOP_GRACE
from django_rtq.worker.server import EXIT_GRACE_SECONDS
from django_rtq.workflows import chain, group
from tests.support.polling import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

#: Threads of the worker under test; as many good tasks must run at once after the bad ones.
CONCURRENCY = 2
#: Seconds a bad task gets to be archived or dropped (a healthy worker needs well under one).
SETTLE_TIMEOUT = 8.0
#: Seconds the good tasks get to start together, and then to finish.
GOOD_TIMEOUT = 10.0
QUEUE = "default"
OTHER_QUEUE = "other"
LIVE_STATES = ("pending", "active", "scheduled", "retry")
STATE_SETS = (*LIVE_STATES, "archived", "completed")

PROPERTY_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the repository
    # Shrinking re-runs a failing example many times, each up to SETTLE_TIMEOUT: too slow here.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# The lab: a broker on the test's prefix, log capture, thread deaths, and worker rounds


@pytest.fixture
def thread_deaths() -> Iterator[list[str]]:
    """Uncaught exceptions that ended a thread, while the test runs."""
    deaths: list[str] = []
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread else "?"
        deaths.append(f"thread {name!r} died: {args.exc_type.__name__}: {args.exc_value}")
        previous(args)

    threading.excepthook = hook
    yield deaths
    threading.excepthook = previous


def stop_seconds() -> float:
    """How long stopping a worker may take: its handlers get the shutdown timeout, then the stop
    grace to end once told to (worker/processor/watchdog.py), and the process's exit grace."""
    return get_settings().SHUTDOWN_TIMEOUT + SHUTDOWN_STOP_GRACE + EXIT_GRACE_SECONDS


@dataclass
class Lab:
    broker: Broker
    client: redis.Redis
    caplog: pytest.LogCaptureFixture
    deaths: list[str]
    run_worker: Callable[..., Any]
    prefix: str
    log_mark: int = 0
    death_mark: int = 0
    #: Whether this round wrote a value that is not UTF-8 (see report()).
    undecodable: bool = False

    def keys(self, queue: str = QUEUE):
        return self.broker.queue(queue)

    def wipe(self) -> None:
        """Delete every key of the test's prefix, so each round starts from nothing."""
        for pattern in (f"{self.prefix}:*", f"rtqtest-report:{self.prefix}:*"):
            found = list(self.client.scan_iter(pattern, count=1000))
            if found:
                self.client.delete(*found)

    @contextmanager
    def round(self) -> Iterator[list[str]]:
        """Yield the list a round of bad data adds its problems to; the test's keys are wiped
        before and after, so rounds (hypothesis examples) do not see each other's data."""
        self.wipe()
        self.undecodable = False
        problems: list[str] = []
        try:
            yield problems
        finally:
            self.wipe()

    @contextmanager
    def worker(self, problems: list[str], queues: dict[str, int] | None = None) -> Iterator[Any]:
        self.log_mark = len(self.caplog.records)
        self.death_mark = len(self.deaths)
        context = self.run_worker(queues=queues or {QUEUE: 1}, concurrency=CONCURRENCY)
        worker = context.__enter__()
        try:
            yield worker
        finally:
            started = time.monotonic()
            try:
                context.__exit__(None, None, None)
            except Exception as exc:
                problems.append(f"stopping the worker raised {type(exc).__name__}: {exc}")
            if time.monotonic() - started > stop_seconds():
                problems.append(
                    f"stopping the worker took {time.monotonic() - started:.0f}s, over {stop_seconds():.0f}s"
                )
            problems.extend(self.deaths[self.death_mark :])

    # What the log says

    def log_lines(self, level: int = logging.WARNING) -> list[str]:
        lines = []
        for record in self.caplog.records[self.log_mark :]:
            if record.name.startswith("django_rtq") and record.levelno >= level:
                text = f"{record.levelname} {record.name}: {record.getMessage()}"
                if record.exc_info and record.exc_info[1] is not None:
                    error = record.exc_info[1]
                    text += f" [{type(error).__name__}: {error}]"
                lines.append(text)
        return lines

    def logged_about(self, *needles: str) -> list[str]:
        return [line for line in self.log_lines() if any(needle in line for needle in needles)]

    def tracebacks(self) -> list[str]:
        """ERROR records with an exception: a component that failed a pass, or a thread that ended."""
        return [line for line in self.log_lines(logging.ERROR) if "[" in line]

    # Where a task is

    def where(self, task_id: str, queue: str = QUEUE) -> tuple[str | None, list[str]]:
        """The task's state (its `state` hash field) and the sorted sets that hold it."""
        keys = self.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(keys.state, task_id)
        for name in STATE_SETS:
            pipe.zscore(getattr(keys, name), task_id)
        state, *scores = pipe.execute()
        return state, [name for name, score in zip(STATE_SETS, scores, strict=True) if score is not None]

    def is_live(self, task_id: str, queue: str = QUEUE) -> bool:
        state, sets = self.where(task_id, queue)
        return state in LIVE_STATES or state == "waiting" or any(name in LIVE_STATES for name in sets)

    def archive_reason(self, task_id: str, queue: str = QUEUE) -> str | None:
        raw = self.client.hget(self.keys(queue).info, task_id)
        try:
            info = json.loads(raw) if raw else None
        except ValueError:
            return None
        return info.get("error") if isinstance(info, dict) else None

    def ran(self, report_name: str) -> bool:
        return self.client.llen(tasks.report_key(report_name)) > 0

    # Verdicts

    def wait_until_settled(self, task_ids: list[str], queue: str = QUEUE, timeout: float = SETTLE_TIMEOUT):
        wait_for(
            lambda: not any(self.is_live(task_id, queue) for task_id in task_ids),
            timeout,
            interval=0.05,
            fail=False,
        )

    def judge_bad_task(
        self,
        label: str,
        task_id: str,
        *,
        report_name: str | None = None,
        may_run: bool = False,
        queue: str = QUEUE,
    ) -> list[str]:
        """What is wrong with how the worker treated a bad task (nothing, ideally)."""
        problems = []
        state, sets = self.where(task_id, queue)
        where = f"state {state!r}, in {sets or 'no sorted set'}"
        if self.is_live(task_id, queue):
            problems.append(f"{label}: task {task_id} is stuck ({where}) at the end of the wait")
        elif state == "archived" and not self.archive_reason(task_id, queue):
            raw = self.client.hget(self.keys(queue).info, task_id)
            problems.append(f"{label}: task {task_id} was archived without a reason in its info ({raw!r})")
        elif state == "completed" and not may_run:
            problems.append(f"{label}: task {task_id} completed although its message is malformed")
        if report_name and not may_run and self.ran(report_name):
            problems.append(f"{label}: the handler of task {task_id} ran although its message is malformed")
        if not self.logged_about(task_id):
            problems.append(f"{label}: no WARNING or worse names task {task_id} ({where})")
        return problems

    def good_work_runs(self, queue: str = QUEUE) -> str | None:
        """Enqueue CONCURRENCY good tasks that each wait until all have started: they can only
        finish if the worker still runs that many at once. Return a problem, or None."""
        names = [f"good-{uuid.uuid4().hex[:8]}-{i}" for i in range(CONCURRENCY)]
        for name in names:
            tasks.block.using(queue=queue).enqueue(name, 2 * GOOD_TIMEOUT)

        def started() -> int:
            return sum(self.ran(f"{name}:started") for name in names)

        wait_for(lambda: started() >= CONCURRENCY, GOOD_TIMEOUT, interval=0.02, fail=False)
        count = started()
        for name in names:
            self.client.set(tasks.report_key(f"release:{name}"), "1")
        if count < CONCURRENCY:
            return (
                f"only {count} of {CONCURRENCY} good tasks enqueued to {queue!r} after the bad data "
                f"started within {GOOD_TIMEOUT}s (the worker lost executor threads, or stopped claiming)"
            )
        wait_for(lambda: all(self.ran(name) for name in names), GOOD_TIMEOUT, interval=0.02, fail=False)
        if not all(self.ran(name) for name in names):
            return f"good tasks in {queue!r} started but did not finish within {GOOD_TIMEOUT}s"
        return None

    def report(self, problems: list[str], what: str) -> None:
        if problems:
            context = self.log_lines()[-25:]
            if self.undecodable:
                problems = [
                    *problems,
                    "note: this round wrote a value that is not UTF-8; a claim or recovery reply "
                    "that cannot be decoded strands every task of its batch, so tasks stuck "
                    "'active' beside it may be collateral",
                ]
            raise AssertionError(
                f"{what}: {len(problems)} problem(s)\n- "
                + "\n- ".join(problems)
                + "\nworker log (WARNING and worse, last 25):\n  "
                + ("\n  ".join(context) or "(nothing)")
            )


@pytest.fixture
def lab(broker, redis_client, caplog, thread_deaths, run_worker, prefix) -> Lab:
    caplog.set_level(logging.WARNING, logger="django_rtq")
    return Lab(
        broker=broker,
        client=redis_client,
        caplog=caplog,
        deaths=thread_deaths,
        run_worker=run_worker,
        prefix=prefix,
    )


#: The lease (seconds) of the workers of the recoverer's tests: a recoverer waits about a lease
#: after it starts before it takes tasks back, so that a live worker cut off from Redis can
#: renew its leases first; the suite's lease of 30 s would outlast the test.
SHORT_LEASE = 2.0
#: Seconds a task the recoverer took back gets to start, on a loaded machine.
RECOVERED_RUN_SECONDS = 2.0


def recovery_seconds() -> float:
    """How soon after it starts a worker takes back tasks whose lease lapsed long ago: its
    recoverer is in touch with Redis for a lease and a heartbeat first (worker/server.py), then
    takes back, at its next pass, the leases past the grace."""
    conf = get_settings()
    return conf.LEASE_SECONDS + conf.HEARTBEAT_INTERVAL + conf.RECOVERER_INTERVAL + conf.RECOVERY_GRACE


@pytest.fixture
def short_lease_lab(request, settings, prefix, redis_client, caplog, thread_deaths) -> Lab:
    """A lab whose broker and workers hold leases of SHORT_LEASE seconds."""
    from django_rtq.connection import reset_broker

    settings.RTQ = {**settings.RTQ, "LEASE_SECONDS": SHORT_LEASE}
    reset_broker()  # the broker and run_worker fixtures, asked for now, get the short lease
    caplog.set_level(logging.WARNING, logger="django_rtq")
    return Lab(
        broker=request.getfixturevalue("broker"),
        client=redis_client,
        caplog=caplog,
        deaths=thread_deaths,
        run_worker=request.getfixturevalue("run_worker"),
        prefix=prefix,
    )


# Corruptions, each named for the report


@dataclass(frozen=True)
class Corruption:
    """A bad value for a task's field in a column hash: `make(original)` returns the bytes or
    text to write instead of the original value, or None to delete the field."""

    label: str
    make: Callable[[str], str | bytes | None] = field(compare=False)

    def __repr__(self) -> str:
        return self.label


def replace_with(label: str, value: str | bytes | None) -> Corruption:
    return Corruption(label, lambda original: value)


def edit_message(label: str, edit: Callable[[dict[str, Any]], None]) -> Corruption:
    """A corruption of a valid message: decode it, `edit` the dict in place, encode it again."""

    def make(original: str) -> str:
        data = json.loads(original)
        edit(data)
        return json.dumps(data)

    return Corruption(label, make)


def set_field(name: str, value: Any) -> Corruption:
    return edit_message(f"message {name}={json.dumps(value)}", lambda data: data.__setitem__(name, value))


def drop_field(name: str) -> Corruption:
    return edit_message(f"message without {name}", lambda data: data.pop(name, None))


#: The fields a message may have: its dataclass's, and its format version "v" (a message of a
#: newer format is not malformed: it waits for a newer worker, see LEFT_FOR_ANOTHER_RELEASE).
MESSAGE_FIELDS = (*TaskMessage.__dataclass_fields__, "v")
NOT_UTF8 = b"\xff\xfe\x80 not utf-8"

#: Every case issue 10 lists for task messages, and a few more.
MESSAGE_CATALOGUE = [
    replace_with("message not JSON: '{'", "{"),
    replace_with("message not JSON: 'not json'", "not json"),
    replace_with("message not JSON: single quotes", "{'id': 'x'}"),
    replace_with("message empty string", ""),
    replace_with("message not UTF-8", NOT_UTF8),
    replace_with("message JSON array", "[]"),
    replace_with("message JSON number", "42"),
    replace_with("message JSON string", '"a task"'),
    replace_with("message JSON null", "null"),
    replace_with("message JSON true", "true"),
    # JSON values Python reads as false
    replace_with("message JSON false", "false"),
    replace_with("message JSON 0", "0"),
    replace_with('message JSON ""', '""'),
    replace_with("message JSON {}", "{}"),
    replace_with("message missing", None),
    edit_message("message with unexpected field colour", lambda data: data.__setitem__("colour", "red")),
    drop_field("task"),
    set_field("timeout", "5"),
    set_field("args", {}),
    set_field("kwargs", []),
    set_field("deadline", "x"),
    set_field("max_retries", None),
    set_field("priority", "high"),
    set_field("retention", -1),
    set_field("task", None),
    set_field("task", 5),
    set_field("enqueued_at", "yesterday"),
    set_field("process_at", "later"),
    set_field("unique_key", 5),
    set_field("unique_ttl", "long"),
    set_field("parent", 5),
    set_field("position", {}),
]

# JSON values by type, for values of the wrong type
NULL = st.none()
BOOL = st.booleans()
INT = st.integers(-(10**6), 10**6)
FRACTION = st.floats(allow_nan=False, allow_infinity=False, width=32).filter(lambda x: x != int(x))
TEXT = st.text(max_size=6)
SCALAR = st.one_of(NULL, BOOL, INT, FRACTION, TEXT)
LIST = st.lists(SCALAR, max_size=3)
OBJECT = st.dictionaries(st.text(max_size=4), SCALAR, max_size=3)
NOT_A_STRING = st.one_of(NULL, BOOL, INT, FRACTION, LIST, OBJECT)
NOT_A_NUMBER = st.one_of(BOOL, TEXT, LIST, OBJECT)
OPTIONAL_STRING = st.one_of(BOOL, INT, FRACTION, LIST, OBJECT)

#: For each message field, values it must not have. The id and the queue are not stored (a
#: stored one, from an earlier version, is ignored: see tests/test_message_storage.py).
WRONG_MESSAGE_VALUES = {
    "task": NOT_A_STRING,
    "args": st.one_of(NULL, BOOL, INT, TEXT, OBJECT),
    "kwargs": st.one_of(NULL, BOOL, INT, TEXT, LIST),
    "priority": st.one_of(NULL, NOT_A_NUMBER, FRACTION, st.integers(101, 10**6), st.integers(-(10**6), -101)),
    "max_retries": st.one_of(NULL, NOT_A_NUMBER, FRACTION, st.integers(-(10**6), -1)),
    "timeout": st.one_of(NOT_A_NUMBER, st.integers(-(10**6), -1)),  # null: no timeout, valid
    "deadline": NOT_A_NUMBER,
    "retention": st.one_of(NULL, NOT_A_NUMBER, st.integers(-(10**6), -1)),
    "unique_key": OPTIONAL_STRING,
    "unique_ttl": NOT_A_NUMBER,
    "enqueued_at": st.one_of(NULL, NOT_A_NUMBER),
    "process_at": NOT_A_NUMBER,
    "parent": OPTIONAL_STRING,
    "parent_queue": OPTIONAL_STRING,
    "position": st.one_of(BOOL, FRACTION, LIST, OBJECT),
}


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


NOT_JSON = st.text(min_size=1, max_size=20).filter(_not_json)
NOT_AN_OBJECT = st.one_of(SCALAR, LIST).map(json.dumps)

bad_messages = st.one_of(
    NOT_JSON.map(lambda text: replace_with(f"message not JSON: {text!r}", text)),
    st.binary(min_size=1, max_size=8).map(
        lambda raw: replace_with(f"message bytes {NOT_UTF8 + raw!r}", NOT_UTF8 + raw)
    ),
    NOT_AN_OBJECT.map(lambda text: replace_with(f"message JSON {text}", text)),
    st.just(replace_with("message missing", None)),
    st.tuples(st.text(min_size=1, max_size=8).filter(lambda k: k not in MESSAGE_FIELDS), SCALAR).map(
        lambda kv: edit_message(f"message with unexpected field {kv[0]!r}", lambda d: d.__setitem__(*kv))
    ),
    st.just(drop_field("task")),
    st.sampled_from(sorted(WRONG_MESSAGE_VALUES)).flatmap(
        lambda name: WRONG_MESSAGE_VALUES[name].map(lambda value: set_field(name, value))
    ),
)

#: Task types a bad info is tried on: a plain one, one with a retention (its info is merged
#: on success) and one that fails (its info is merged on failure: errors, retried).
INFO_TASKS = {
    "record": lambda name: tasks.record.enqueue(name),
    "add(retention)": lambda name: tasks.add.enqueue(1, 2),
    "always_fails": lambda name: tasks.always_fails.enqueue(name),
}

INFO_CATALOGUE = [
    replace_with("info not JSON: '{'", "{"),
    replace_with("info not JSON: 'x'", "x"),
    replace_with("info not UTF-8", NOT_UTF8),
    replace_with("info JSON array", "[]"),
    replace_with("info JSON number", "5"),
    replace_with("info JSON null", "null"),
    replace_with("info JSON string", '"s"'),
    replace_with("info JSON false", "false"),
    replace_with("info JSON 0", "0"),
    replace_with('info {"retried": "x"}', '{"retried": "x"}'),
    replace_with('info {"retried": null}', '{"retried": null}'),
    replace_with('info {"retried": 1.5}', '{"retried": 1.5}'),
    replace_with('info {"retried": []}', '{"retried": []}'),
    replace_with('info {"errors": 5}', '{"errors": 5}'),
    replace_with('info {"errors": "x"}', '{"errors": "x"}'),
    replace_with('info {"errors": {}}', '{"errors": {}}'),
    replace_with('info {"workers": "a"}', '{"workers": "a"}'),
    replace_with('info {"workers": 5}', '{"workers": 5}'),
    replace_with('info {"started_at": "x"}', '{"started_at": "x"}'),
    replace_with('info {"error": 5, "traceback": []}', '{"error": 5, "traceback": []}'),
]

WRONG_INFO_VALUES = {
    "retried": st.one_of(NULL, NOT_A_NUMBER, FRACTION),
    "errors": st.one_of(NULL, BOOL, INT, TEXT, OBJECT),
    "workers": st.one_of(NULL, BOOL, INT, TEXT, OBJECT),
    "started_at": NOT_A_NUMBER,
    "attempted_at": NOT_A_NUMBER,
    "worker": OPTIONAL_STRING,
    "error": OPTIONAL_STRING,
    "error_type": OPTIONAL_STRING,
    "traceback": OPTIONAL_STRING,
}

bad_infos = st.one_of(
    NOT_JSON.map(lambda text: replace_with(f"info not JSON: {text!r}", text)),
    st.binary(min_size=1, max_size=8).map(
        lambda raw: replace_with(f"info bytes {NOT_UTF8 + raw!r}", NOT_UTF8 + raw)
    ),
    NOT_AN_OBJECT.map(lambda text: replace_with(f"info JSON {text}", text)),
    st.dictionaries(st.sampled_from(sorted(WRONG_INFO_VALUES)), st.none(), min_size=1, max_size=3)
    .flatmap(lambda chosen: st.fixed_dictionaries({name: WRONG_INFO_VALUES[name] for name in chosen}))
    .map(lambda info: replace_with(f"info {json.dumps(info)}", json.dumps(info))),
)


def write_corruption(lab: Lab, hash_key: str, task_id: str, corruption: Corruption) -> None:
    original = lab.client.hget(hash_key, task_id)
    assert original is not None, f"task {task_id} has no {hash_key} field to corrupt"
    value = corruption.make(original)
    if isinstance(value, bytes):
        lab.undecodable = True
    if value is None:
        lab.client.hdel(hash_key, task_id)
    else:
        lab.client.hset(hash_key, task_id, value)


# Task messages


def plant_messages(lab: Lab, corruptions: list[Corruption], label: str) -> list[tuple[Corruption, str, str]]:
    """Enqueue a `record` task per corruption and rewrite its stored message with it; return
    (corruption, task id, report name) of each."""
    planted = []
    for corruption in corruptions:
        name = f"{label}-{uuid.uuid4().hex[:8]}"
        message = tasks.record.enqueue(name)
        write_corruption(lab, lab.keys().msg, message.id, corruption)
        planted.append((corruption, message.id, name))
    return planted


def check_bad_messages(lab: Lab, corruptions: list[Corruption]) -> None:
    with lab.round() as problems:
        bad = plant_messages(lab, corruptions, "bad")
        with lab.worker(problems):
            lab.wait_until_settled([task_id for _, task_id, _ in bad])
            for corruption, task_id, name in bad:
                problems += lab.judge_bad_task(corruption.label, task_id, report_name=name)
            problem = lab.good_work_runs()
            if problem:
                problems.append(problem)
        lab.report(problems, f"{len(corruptions)} malformed task message(s)")


# The catalogues run the values that are not UTF-8 apart from the others: a reply that cannot be
# decoded may spoil its whole batch, which would hide what happens to the rest.
ENCODINGS = ["utf-8", "not-utf-8"]


def of_encoding(encoding: str, corruptions: list[Corruption]) -> list[Corruption]:
    return [c for c in corruptions if ("not UTF-8" in c.label) == (encoding == "not-utf-8")]


#: Messages that are not malformed, but for a worker of another release: they wait for one,
#: neither run nor archived (docs/deploying.md).
LEFT_FOR_ANOTHER_RELEASE = [
    set_field("task", "tests.testapp.tasks.no_such_task"),
    edit_message("message of the next format", lambda data: data.update(v=MESSAGE_FORMAT + 1, colour="red")),
]


def test_messages_for_another_release_wait_for_it_and_the_worker_says_so(lab):
    with lab.round() as problems:
        left = plant_messages(lab, LEFT_FOR_ANOTHER_RELEASE, "left")
        with lab.worker(problems):

            def parked(task_id: str) -> bool:
                return (lab.client.zscore(lab.keys().pending, task_id) or 0) >= PARKED_BASE

            wait_for(lambda: all(parked(task_id) for _, task_id, _ in left), 10, fail=False)
            for corruption, task_id, name in left:
                state, sets = lab.where(task_id)
                if not parked(task_id) or state != "pending":
                    problems.append(
                        f"{corruption.label}: task {task_id} does not wait ({state!r}, in {sets})"
                    )
                if lab.ran(name):
                    problems.append(f"{corruption.label}: the handler of task {task_id} ran")
            if not lab.logged_about("for a worker that can run them"):
                problems.append("no WARNING says that tasks were left for a worker that can run them")
            problem = lab.good_work_runs()
            if problem:
                problems.append(problem)
        lab.report(problems, f"{len(left)} message(s) for another release")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_catalogue_of_malformed_task_messages(lab, encoding):
    check_bad_messages(lab, of_encoding(encoding, MESSAGE_CATALOGUE))


@PROPERTY_SETTINGS
@given(corruptions=st.lists(bad_messages, min_size=1, max_size=3))
def test_malformed_task_messages_are_archived_with_a_reason(lab, corruptions):
    note(f"corruptions: {corruptions}")
    check_bad_messages(lab, corruptions)


# Task info, on pending tasks


def check_bad_infos_of_pending_tasks(lab: Lab, cases: list[tuple[str, Corruption]]) -> None:
    with lab.round() as problems:
        bad = []
        for kind, corruption in cases:
            message = INFO_TASKS[kind](f"bad-{uuid.uuid4().hex[:8]}")
            lab.client.hset(lab.keys().info, message.id, "{}")  # a pending task has none yet
            write_corruption(lab, lab.keys().info, message.id, corruption)
            bad.append((f"{kind} with {corruption.label}", message.id))
        with lab.worker(problems):
            lab.wait_until_settled([task_id for _, task_id in bad])
            for label, task_id in bad:
                problems += lab.judge_bad_task(label, task_id, may_run=True)
            problem = lab.good_work_runs()
            if problem:
                problems.append(problem)
        lab.report(problems, f"{len(cases)} pending task(s) with corrupt info")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_catalogue_of_corrupt_info_on_pending_tasks(lab, encoding):
    check_bad_infos_of_pending_tasks(
        lab,
        [(kind, corruption) for corruption in of_encoding(encoding, INFO_CATALOGUE) for kind in INFO_TASKS],
    )


@PROPERTY_SETTINGS
@given(cases=st.lists(st.tuples(st.sampled_from(sorted(INFO_TASKS)), bad_infos), min_size=1, max_size=3))
def test_corrupt_info_of_pending_tasks_is_coped_with(lab, cases):
    note(f"cases: {cases}")
    check_bad_infos_of_pending_tasks(lab, cases)


# Task info and messages of active tasks whose lease expired: the recoverer's case

DEAD_WORKER = "dead-worker"


def claim_as_dead_worker(lab: Lab, limit: int) -> list[Any]:
    """Claim pending tasks for a worker that then died: their lease expired two minutes ago."""
    # Leases on the server's clock, unless the broker has a clock of its own: one two minutes slow.
    past = Broker(lab.broker.client, prefix=lab.prefix, clock=lambda: time.time() - 120)
    return past.claim(QUEUE, worker_id=DEAD_WORKER, limit=limit)


def check_expired_leases_with_bad_data(lab: Lab, cases: list[tuple[str, Corruption]]) -> None:
    """Tasks claimed by a worker that died (their lease expired a minute ago), some with a
    corrupt info or message, and one intact beside them that the recoverer must still save."""
    with lab.round() as problems:
        intact_name = f"intact-{uuid.uuid4().hex[:8]}"
        intact = tasks.record.enqueue(intact_name)
        bad = []
        for column, corruption in cases:
            name = f"bad-{uuid.uuid4().hex[:8]}"
            bad.append((column, corruption, tasks.record.enqueue(name).id, name))
        claimed = claim_as_dead_worker(lab, len(bad) + 1)
        assert {task.id for task in claimed} == {intact.id} | {task_id for _, _, task_id, _ in bad}
        for column, corruption, task_id, _ in bad:
            hash_key = getattr(lab.keys(), column)
            if column == "info":
                lab.client.hset(hash_key, task_id, "{}")
            write_corruption(lab, hash_key, task_id, corruption)
        with lab.worker(problems):
            started = time.monotonic()
            # The intact task is taken back at the recoverer's first pass that may, and runs.
            due = recovery_seconds() + RECOVERED_RUN_SECONDS
            wait_for(lambda: lab.ran(intact_name), due, interval=0.05, fail=False)
            if not lab.ran(intact_name):
                state, sets = lab.where(intact.id)
                problems.append(
                    f"the intact task {intact.id} of the dead worker was not recovered and run "
                    f"within {due:.1f}s of the worker's start (state {state!r}, in {sets}): one "
                    "bad task spoilt the recoverer's pass for the others"
                )
            timeout = max(0.0, started + recovery_seconds() + SETTLE_TIMEOUT - time.monotonic())
            lab.wait_until_settled([intact.id] + [task_id for _, _, task_id, _ in bad], timeout=timeout)
            for column, corruption, task_id, name in bad:
                label = f"active, lease expired, {corruption.label}"
                problems += lab.judge_bad_task(label, task_id, report_name=name, may_run=column == "info")
            problem = lab.good_work_runs()
            if problem:
                problems.append(problem)
        lab.report(problems, f"{len(cases)} expired task(s) with corrupt data")


RECOVERER_CATALOGUE = [("info", corruption) for corruption in INFO_CATALOGUE] + [
    ("msg", corruption)
    for corruption in MESSAGE_CATALOGUE
    if corruption.label
    in {
        "message not JSON: '{'",
        "message not UTF-8",
        "message JSON array",
        "message missing",
        "message max_retries=null",
        'message deadline="x"',
        "message task=null",
        "message retention=-1",
        "message with unexpected field colour",
    }
]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_catalogue_of_corrupt_data_on_expired_leases(short_lease_lab, encoding):
    chosen = of_encoding(encoding, [corruption for _, corruption in RECOVERER_CATALOGUE])
    check_expired_leases_with_bad_data(
        short_lease_lab, [case for case in RECOVERER_CATALOGUE if case[1] in chosen]
    )


@PROPERTY_SETTINGS
@given(
    cases=st.lists(
        st.one_of(st.tuples(st.just("info"), bad_infos), st.tuples(st.just("msg"), bad_messages)),
        min_size=1,
        max_size=3,
    )
)
def test_the_recoverer_copes_with_corrupt_expired_tasks(short_lease_lab, cases):
    note(f"cases: {cases}")
    check_expired_leases_with_bad_data(short_lease_lab, cases)


# Redis keys of the wrong type

#: The queue keys a worker touches with one task pending, and the type each should have.
QUEUE_KEY_TYPES = {
    "msg": "hash",
    "state": "hash",
    "info": "hash",
    "owner": "hash",
    "pending": "zset",
    "active": "zset",
    "scheduled": "zset",
    "retry": "zset",
    "archived": "zset",
    "completed": "zset",
    "idle": "zset",
}
WRITERS: dict[str, Callable[[redis.Redis, str], Any]] = {
    "string": lambda client, key: client.set(key, "garbage"),
    "list": lambda client, key: client.rpush(key, "garbage"),
    "set": lambda client, key: client.sadd(key, "garbage"),
    "hash": lambda client, key: client.hset(key, "garbage", "garbage"),
    "zset": lambda client, key: client.zadd(key, {"garbage": 1}),
}


def check_wrong_typed_key(lab: Lab, name: str, kind: str) -> None:
    label = f"{name} key a {kind.upper()} instead of a {QUEUE_KEY_TYPES[name].upper()}"
    with lab.round() as problems:
        tasks.record.enqueue(f"victim-{uuid.uuid4().hex[:8]}")  # so that claims touch every column
        key = getattr(lab.keys(), name)
        lab.client.delete(key)
        WRITERS[kind](lab.client, key)
        with lab.worker(problems, queues={QUEUE: 1, OTHER_QUEUE: 1}):
            problem = lab.good_work_runs(OTHER_QUEUE)
            if problem:
                problems.append(f"{label}: with queue {QUEUE!r} broken, {problem}")
            needles = ("WRONGTYPE", key, "wrong type", "wrong kind")
            wait_for(lambda: lab.logged_about(*needles), SETTLE_TIMEOUT, interval=0.05, fail=False)
            if not lab.logged_about(*needles):
                problems.append(f"{label}: nothing logged at WARNING or worse names the problem or the key")
            lab.client.delete(key)  # repaired: the queue must work again
            problem = lab.good_work_runs(QUEUE)
            if problem:
                problems.append(f"{label}: once the key was repaired, {problem}")
        lab.report(problems, label)


@pytest.mark.parametrize("name", sorted(QUEUE_KEY_TYPES))
def test_catalogue_of_wrong_typed_keys(lab, name):
    check_wrong_typed_key(lab, name, "string")


@PROPERTY_SETTINGS
@given(
    case=st.sampled_from(sorted(QUEUE_KEY_TYPES)).flatmap(
        lambda name: st.tuples(st.just(name), st.sampled_from(sorted(set(WRITERS) - {QUEUE_KEY_TYPES[name]})))
    )
)
def test_a_wrong_typed_key_does_not_stop_the_worker(lab, case):
    note(f"case: {case}")
    check_wrong_typed_key(lab, *case)


# Workflows with garbage in their hash

#: Fields of a waiting workflow's hash (see django_rtq/workflows/planner.py and child_outcome.lua),
#: by kind, that applying a child's outcome reads.
WORKFLOW_FIELDS = {
    "chain": ["kind", "n", "done", "queue", "on_error", "created", "retention", "step:1", "step_queue:1"],
    "group": ["kind", "n", "done", "queue", "on_error", "created", "retention"],
}
#: Garbage for a field: None deletes it. Only values no field can take as meaningful, so that a
#: correct engine can tell (a well-formed but wrong count, say, could make a workflow wait forever).
WORKFLOW_GARBAGE = [None, "", "x", "{", "[]", "null", "1.5.2", "{}"]


def check_bad_workflows(lab: Lab, cases: list[tuple[str, str, str | None]]) -> None:
    with lab.round() as problems:
        bad = []
        for kind, name, garbage in cases:
            tag = uuid.uuid4().hex[:8]
            steps = [tasks.record.si(f"wf-{tag}", 1), tasks.record.si(f"wf-{tag}", 2)]
            workflow_id = (chain if kind == "chain" else group)(*steps).enqueue()
            wf_key = lab.keys().workflow(workflow_id)
            assert lab.client.hexists(wf_key, name), (
                f"a {kind} has no field {name!r}: {lab.client.hgetall(wf_key)}"
            )
            if garbage is None:
                lab.client.hdel(wf_key, name)
            else:
                lab.client.hset(wf_key, name, garbage)
            label = f"{kind} with {name}=" + ("(deleted)" if garbage is None else repr(garbage))
            bad.append((label, workflow_id))
        with lab.worker(problems):
            lab.wait_until_settled([workflow_id for _, workflow_id in bad])
            for label, workflow_id in bad:
                state, _ = lab.where(workflow_id)
                if state == "waiting":
                    left = [c for c in lab.client.zrange(lab.keys().commands, 0, -1) if workflow_id in c]
                    problems.append(
                        f"{label}: workflow {workflow_id} still waiting after {SETTLE_TIMEOUT}s "
                        f"(its commands not applied: {left or 'none'})"
                    )
                elif state == "archived":
                    if not lab.archive_reason(workflow_id):
                        problems.append(f"{label}: workflow {workflow_id} archived without a reason")
                    if not lab.logged_about(workflow_id):
                        problems.append(f"{label}: workflow {workflow_id} archived, but no WARNING names it")
            problem = lab.good_work_runs()
            if problem:
                problems.append(problem)
        lab.report(problems, f"{len(cases)} workflow(s) with garbage in their hash")


def test_catalogue_of_garbage_in_waiting_workflows(lab):
    check_bad_workflows(
        lab,
        [
            (kind, name, garbage)
            for kind, names in WORKFLOW_FIELDS.items()
            for name in names
            for garbage in (None, "x")
        ],
    )


@PROPERTY_SETTINGS
@given(
    cases=st.lists(
        st.sampled_from(sorted(WORKFLOW_FIELDS)).flatmap(
            lambda kind: st.tuples(
                st.just(kind), st.sampled_from(WORKFLOW_FIELDS[kind]), st.sampled_from(WORKFLOW_GARBAGE)
            )
        ),
        min_size=1,
        max_size=3,
    )
)
def test_garbage_in_a_waiting_workflow_does_not_stick(lab, cases):
    note(f"cases: {cases}")
    check_bad_workflows(lab, cases)

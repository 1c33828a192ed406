"""A worker runs only what its release can run and leaves the rest, uncounted, for a worker that
can: tasks of a type it does not know, or whose arguments do not fit its handler, wait (parked)
without being claimed again and again; a worker able to run them takes them first; after the
grace with no such worker they are archived saying why. Processors driven one round at a time
stand for workers of two releases, on a real Redis."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_rtq import message_builder, registry
from django_rtq.broker import TaskMessage, TaskState, manual
from django_rtq.broker.claims import PARKED_BASE
from django_rtq.broker.limits import HELD_BASE
from django_rtq.broker.message import MIN_PRIORITY
from django_rtq.broker.versions import INFO_FORMAT, MESSAGE_FORMAT
from django_rtq.broker.waiting import (
    NEWER_FORMAT,
    UNBOUND_ARGUMENTS,
    UNKNOWN_TYPE,
    parse_kind,
    waiting_for_worker,
)
from django_rtq.context import set_current_task
from django_rtq.exceptions import NoWorkerCanRun
from django_rtq.message_builder import signature_fingerprint
from django_rtq.worker.janitor import Janitor
from django_rtq.worker.processor import Processor
from django_rtq.worker.processor.abilities import can_run
from django_rtq.worker.syncer import Syncer
from tests.support.factories import forget
from tests.support.reading import column, ids_in
from tests.support.runs import reports
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

QUEUE = "default"
NEW_TYPE = "tests.release_b.tasks.welcome"


@pytest.fixture
def worker_of(broker):
    """Make processors (workers, one claim round at a time) of the release the registry holds now."""
    made = []

    def make(worker_id: str) -> Processor:
        processor = Processor(
            broker=broker, worker_id=worker_id, queues={QUEUE: 1}, concurrency=4, syncer=Syncer(interval=1)
        )
        made.append(processor)
        return processor

    yield make
    for processor in made:
        processor.fetcher.leave_idle()
    set_current_task(None)


@contextmanager
def registered(name: str, func, **options) -> Iterator[registry.TaskType]:
    """A task type of a newer release: registered for the block only."""
    task_type = registry.task(name=name, **options)(func)
    try:
        yield task_type
    finally:
        forget(name)


def welcome(n):
    tasks.report("welcome", n)
    return n


def run_all(processor: Processor) -> list[str]:
    """Run every job the processor holds, settle them; return their ids."""
    work = processor.jobs.work
    jobs = [work.get_nowait() for _ in range(processor.jobs.queued)]
    for job in jobs:
        assert processor.executor.run(job)
    processor.settler.run_once()
    return [job.id for job in jobs]


def enqueue_new(broker, count: int, **fields) -> list[str]:
    """Enqueue tasks of a type this release does not have, as the web tier of the next one would."""
    messages = [
        TaskMessage(id=f"new-{i}", task=NEW_TYPE, queue=QUEUE, args=[i], **{"retention": 60, **fields})
        for i in range(count)
    ]
    broker.enqueue(messages)
    return [message.id for message in messages]


def claims_of(broker, task_ids: list[str]) -> list[int]:
    return [int(column(broker, QUEUE, "runs", task_id) or 0) for task_id in task_ids]


def test_a_worker_leaves_tasks_of_a_type_it_does_not_know_uncounted_and_claims_them_only_once(
    broker, worker_of, inspector
):
    old = worker_of("old-release")
    ids = enqueue_new(broker, 3, max_retries=0)
    known = [tasks.add.enqueue(i, 1).id for i in range(2)]

    old.fetcher.run_once()
    assert sorted(run_all(old)) == sorted(known)
    assert claims_of(broker, ids) == [1, 1, 1]
    [waiting] = waiting_for_worker(broker, QUEUE)
    assert (waiting.task, waiting.why, waiting.count) == (NEW_TYPE, UNKNOWN_TYPE, 3)
    assert waiting.reason == f"unknown task type {NEW_TYPE!r}"
    for task_id in ids:
        task = inspector.get_task(task_id)
        assert task.state == TaskState.PENDING and task.attempt.retried == 0 and not task.last_error

    # More of them, among tasks it knows: the claim passes over them without handing them out.
    broker.enqueue([TaskMessage(id="new-late", task=NEW_TYPE, queue=QUEUE)])
    later = [tasks.add.enqueue(5, 5).id]
    old.fetcher.run_once()
    old.fetcher.run_once()
    assert run_all(old) == later
    assert claims_of(broker, ids) == [1, 1, 1]  # not claimed again
    assert claims_of(broker, ["new-late"]) == [0]  # parked as the claim passed it
    assert waiting_for_worker(broker, QUEUE)[0].count == 4
    assert ids_in(broker, QUEUE, TaskState.ARCHIVED) == []


def test_a_worker_of_the_release_that_knows_the_type_takes_the_waiting_tasks_first(
    broker, worker_of, inspector, redis_client
):
    old = worker_of("old-release")
    ids = enqueue_new(broker, 3)
    old.fetcher.run_once()
    assert old.jobs.queued == 0

    with registered(NEW_TYPE, welcome):
        new = worker_of("new-release")
        behind = tasks.add.enqueue(1, 1).id
        assert new.fetcher.run_once() is True  # it judged the waiting kind: it claims again at once
        new.fetcher.run_once()
        ran = run_all(new)
    assert ran[:3] == ids and ran[3:] == [behind]
    assert sorted(reports(redis_client, "welcome")) == ["0", "1", "2"]
    for task_id in ids:
        task = inspector.get_task(task_id)
        assert task.state == TaskState.COMPLETED and task.attempt.retried == 0
    assert waiting_for_worker(broker, QUEUE) == []
    assert redis_client.exists(broker.queue(QUEUE).parked, broker.queue(QUEUE).parked_kinds) == 0


def old_c(i):
    tasks.report("c", f"{i}")


def new_c(i, j=0):
    tasks.report("c", f"{i}:{j}")


def other_c(i, k=0):
    tasks.report("c", f"other {i}:{k}")


def test_arguments_that_do_not_fit_a_release_wait_for_one_they_fit(
    broker, worker_of, inspector, redis_client
):
    name = "tests.release_b.tasks.c"
    enqueued = TaskMessage(id="c-1", task=name, queue=QUEUE, args=[1], kwargs={"j": 1}, retention=60)
    broker.enqueue([enqueued])
    broker.announce_signatures([(name, signature_fingerprint(new_c))])  # as the web tier enqueueing it did
    with registered(name, old_c):
        old = worker_of("old-release")
        old.fetcher.run_once()
        [waiting] = waiting_for_worker(broker, QUEUE)
        assert (waiting.task, waiting.why, waiting.count) == (name, UNBOUND_ARGUMENTS, 1)
        assert "unexpected keyword argument 'j'" in waiting.reason
        old.fetcher.run_once()
        assert claims_of(broker, ["c-1"]) == [1]
    with registered(name, other_c):  # a second release it does not fit either
        other = worker_of("other-release")
        other.fetcher.run_once()
        other.fetcher.run_once()
        assert claims_of(broker, ["c-1"]) == [2]
        [kind] = redis_client.hkeys(broker.queue(QUEUE).parked_kinds)
        assert len(parse_kind(kind)[2]) == 2  # both releases refused it: neither takes it again
    with registered(name, old_c):
        old.fetcher.run_once()
        assert claims_of(broker, ["c-1"]) == [2]
    with registered(name, new_c):
        new = worker_of("new-release")
        new.fetcher.run_once()
        new.fetcher.run_once()
        assert run_all(new) == ["c-1"]
    assert reports(redis_client, "c") == ["1:1"]
    done = inspector.get_task("c-1")
    assert done.state == TaskState.COMPLETED and done.attempt.retried == 0


def test_tasks_no_worker_took_for_the_grace_are_archived_saying_why_and_can_run_again(
    broker, worker_of, inspector, clock
):
    broker.clock = clock
    ids = enqueue_new(broker, 2)
    worker_of("old-release").fetcher.run_once()
    janitor = Janitor(
        broker=broker,
        queues=[QUEUE],
        interval=1,
        archive_max_age=3600,
        archive_max_size=100,
        no_worker_grace=600,
    )
    clock.advance(599)
    assert janitor.archive_waited(QUEUE) == 0
    clock.advance(2)
    assert janitor.archive_waited(QUEUE) == 2

    for task_id in ids:
        task = inspector.get_task(task_id)
        assert task.state == TaskState.ARCHIVED
        assert task.attempt.error_type == "django_rtq.exceptions.NoWorkerCanRun"
        assert task.last_error == f"no worker could run it for 0.166667 h: unknown task type {NEW_TYPE!r}"
    assert waiting_for_worker(broker, QUEUE) == []
    assert manual.run_now(broker, QUEUE, ids) == 2
    assert sorted(ids_in(broker, QUEUE, TaskState.PENDING)) == sorted(ids)
    assert NoWorkerCanRun.__module__ == "django_rtq.exceptions"


def test_a_renamed_task_type_runs_the_tasks_queued_under_its_old_name(broker, worker_of, redis_client):
    broker.enqueue([TaskMessage(id="old-name", task="tests.old_module.greet", queue=QUEUE, args=[7])])
    with registered("tests.new_module.greet", welcome, aliases=["tests.old_module.greet"]):
        assert registry.find_task_type("tests.old_module.greet").name == "tests.new_module.greet"
        worker = worker_of("renamed")
        worker.fetcher.run_once()
        assert run_all(worker) == ["old-name"]
    assert reports(redis_client, "welcome") == ["7"]
    assert registry.find_task_type("tests.old_module.greet") is None


def test_an_alias_may_not_name_another_task_type():
    with (
        pytest.raises(ImproperlyConfigured, match=r"cannot take the alias 'tests\.testapp\.tasks\.add'"),
        registered("tests.new_module.adder", welcome, aliases=["tests.testapp.tasks.add"]),
    ):
        pass


def test_waiting_tasks_of_a_limited_type_start_within_its_limits(broker, worker_of):
    ids = enqueue_new(broker, 3)
    worker_of("old-release").fetcher.run_once()
    with registered(NEW_TYPE, welcome, max_concurrency=1):
        new = worker_of("new-release")
        new.fetcher.run_once()
        new.fetcher.run_once()
        assert new.jobs.queued == 1  # one slot: one of them started
        assert run_all(new) == ids[:1]
        new.fetcher.run_once()
        assert run_all(new) == ids[1:2]
    assert waiting_for_worker(broker, QUEUE)[0].count == 1


def newer_message(task: str) -> str:
    """A message as the next release would store it: a format version above this one's, and a
    field this release does not know."""
    return json.dumps({"task": task, "v": MESSAGE_FORMAT + 1, "args": [1], "weight": 3, "enqueued_at": 1.0})


def test_a_task_stored_in_a_newer_format_waits_for_a_release_that_reads_it(broker, worker_of, redis_client):
    tasks.add.using(task_id="newer").enqueue(1, 2)
    redis_client.hset(broker.queue(QUEUE).msg, "newer", newer_message("tests.testapp.tasks.add"))
    worker = worker_of("this-release")
    worker.fetcher.run_once()
    worker.fetcher.run_once()
    assert worker.jobs.queued == 0
    assert claims_of(broker, ["newer"]) == [1]
    [waiting] = waiting_for_worker(broker, QUEUE)
    assert (waiting.task, waiting.why, waiting.count) == ("tests.testapp.tasks.add", NEWER_FORMAT, 1)
    newer, readable = MESSAGE_FORMAT + 1, MESSAGE_FORMAT
    assert waiting.reason == (
        f"its stored message is of format version {newer}; this release reads up to {readable}"
    )
    assert ids_in(broker, QUEUE, TaskState.ARCHIVED) == []
    assert not can_run(redis_client.hkeys(broker.queue(QUEUE).parked_kinds)[0])


def test_a_task_whose_info_is_of_a_newer_format_waits_too(broker, worker_of, redis_client):
    tasks.add.using(task_id="newer-info").enqueue(1, 2)
    redis_client.hset(
        broker.queue(QUEUE).info, "newer-info", json.dumps({"v": INFO_FORMAT + 1, "retried": 1})
    )
    worker_of("this-release").fetcher.run_once()
    [waiting] = waiting_for_worker(broker, QUEUE)
    assert (waiting.why, waiting.count) == (NEWER_FORMAT, 1)
    assert "its stored info is of format version" in waiting.reason


def test_parked_base_is_the_same_in_python_and_lua_and_above_every_held_score():
    lib = (Path(__file__).parent.parent / "django_rtq/broker/lua/_lib.lua").read_text()
    assert int(re.search(r"^local PARKED_BASE = (\d+)$", lib, re.M)[1]) == PARKED_BASE
    lowest_priority_band = (100 - MIN_PRIORITY) * 10**13
    assert HELD_BASE + lowest_priority_band + 10**13 < PARKED_BASE
    assert PARKED_BASE + lowest_priority_band + 10**13 < 2**53  # still exact in a double


def test_a_worker_finds_the_kinds_it_can_run_behind_many_it_cannot(broker, worker_of):
    broker.enqueue([TaskMessage(id=f"gone-{i}", task=f"tests.gone.t{i:02}", queue=QUEUE) for i in range(60)])
    old = worker_of("old-release")
    while old.fetcher.run_once():
        pass
    ids = enqueue_new(broker, 2)
    old.fetcher.run_once()
    assert len(waiting_for_worker(broker, QUEUE)) == 61

    with registered(NEW_TYPE, welcome):
        new = worker_of("new-release")
        rounds = 0
        while new.fetcher.run_once() and rounds < 5:  # two rounds of judging: 50 kinds, then 11
            rounds += 1
        assert run_all(new) == ids
    assert rounds == 2


def test_the_janitor_notes_again_kinds_whose_facts_were_lost(broker, worker_of, redis_client):
    ids = enqueue_new(broker, 2)
    worker_of("old-release").fetcher.run_once()
    redis_client.delete(broker.queue(QUEUE).parked_kinds)  # lost: the tasks would wait unseen
    assert waiting_for_worker(broker, QUEUE) == []

    janitor = Janitor(broker=broker, queues=[QUEUE], interval=1, archive_max_age=3600, archive_max_size=100)
    janitor.archive_waited(QUEUE)
    [waiting] = waiting_for_worker(broker, QUEUE)
    assert (waiting.task, waiting.count) == (NEW_TYPE, 2)
    assert waiting.reason == f"waiting for a worker that can run task type {NEW_TYPE!r}"
    with registered(NEW_TYPE, welcome):
        new = worker_of("new-release")
        new.fetcher.run_once()
        new.fetcher.run_once()
        assert run_all(new) == ids


def test_arguments_that_fit_no_release_that_enqueues_or_runs_the_type_are_archived_at_once(
    broker, worker_of, inspector
):
    name = "tests.release_b.tasks.c"
    enqueued = TaskMessage(id="c-1", task=name, queue=QUEUE, args=[1], kwargs={"j": 1}, max_retries=5)
    broker.enqueue([enqueued])  # as a producer that binds nothing would
    with registered(name, old_c):
        worker = worker_of("only-release")
        worker.fetcher.run_once()
        worker.settler.run_once()
    archived = inspector.get_task("c-1")
    assert archived.state == TaskState.ARCHIVED and archived.attempt.retried == 0
    assert "its arguments do not fit tests.release_b.tasks.c: got an unexpected keyword argument 'j'" in (
        archived.last_error
    )
    assert "nor do they fit any other release that enqueues or runs it" in archived.last_error
    assert waiting_for_worker(broker, QUEUE) == []


def test_a_process_that_enqueues_a_type_announces_the_signature_it_binds_to(broker, redis_client):
    message_builder.forget_announcements()
    tasks.add.enqueue(1, 2)
    fingerprint = signature_fingerprint(tasks.add.func)
    assert broker.signatures_of("tests.testapp.tasks.add", seen_since_ms=0) == {fingerprint}
    redis_client.delete(broker.keys.signatures)
    tasks.add.enqueue(1, 2)  # announced already: not again within the hour
    assert broker.signatures_of("tests.testapp.tasks.add", seen_since_ms=0) == set()

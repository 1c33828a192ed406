"""Bulk jobs (broker/bulk.py) on a real Redis, standalone and cluster: an action on whole states,
a page at a time, carried on by whoever holds the job's lock; and the worker's bulk runner."""

from __future__ import annotations

import json
import threading

import pytest

from django_rtq.broker import Broker, TaskState, bulk, manual
from django_rtq.broker.bulk import BulkJob
from django_rtq.broker.states import ACTION_STATES, BULK_ACTIONS, Action, ActionNotAllowed, check_action
from django_rtq.exceptions import InvalidStateTransition
from django_rtq.operations import Operations
from django_rtq.worker.bulk_runner import BulkRunner
from tests.support.clock import FakeClock
from tests.support.factories import (
    BILLING,
    EMAILS,
    SEARCH,
    claim_ids,
    enqueue,
    finished_workflows,
    make_each,
    make_tasks,
)
from tests.support.polling import wait_for
from tests.support.reading import holds_columns, ids_in, lock_holder

S = TaskState
#: Where each action sends the tasks it moves (None: gone).
TARGET = {Action.RUN: S.PENDING, Action.ARCHIVE: S.ARCHIVED, Action.DELETE: None}


@pytest.fixture
def small_pages(monkeypatch) -> int:
    monkeypatch.setattr(bulk, "PAGE", 2)
    return 2


def count(broker: Broker, queue: str, state: TaskState) -> int:
    return broker.client.zcard(broker.queue(queue).state_set(state))


def finish(broker: Broker, queue: str, job_id: str, *, most: int = 50) -> tuple[BulkJob, int]:
    """Carry a job on one page at a time until it finishes; return it and the steps it took."""
    for step in range(1, most + 1):
        job = bulk.carry_on(broker, queue, job_id, budget=0)
        assert job is not None
        if job.finished:
            return job, step
    pytest.fail(f"bulk job {job_id} not finished after {most} steps")


def progress(job: BulkJob) -> tuple[int, int, int, int, bool, TaskState | None]:
    return job.done, job.skipped, job.total, job.percent, job.finished, job.current_state


# Acting on whole states, page by page


BULK_CASES = [(action, state) for action in BULK_ACTIONS for state in ACTION_STATES[action]]


@pytest.mark.parametrize(("action", "state"), BULK_CASES, ids=[f"{a}-{s}" for a, s in BULK_CASES])
def test_an_action_on_a_whole_state_moves_it_page_by_page(
    any_broker: Broker, small_pages: int, action: Action, state: TaskState
):
    ids = make_tasks(any_broker, state, SEARCH, count=5)
    [bystander] = make_tasks(any_broker, state, BILLING)

    job, steps = finish(any_broker, SEARCH, bulk.start(any_broker, SEARCH, action, [state]).id)

    assert (job.done, job.skipped, job.total) == (5, 0, 5)
    assert steps == 3  # pages of 2, 2 and 1: the last one ends the job
    assert count(any_broker, SEARCH, state) == 0
    if TARGET[action] is None:
        assert not any(holds_columns(any_broker, SEARCH, task_id) for task_id in ids)
    else:
        assert sorted(ids_in(any_broker, SEARCH, TARGET[action])) == sorted(ids)
    assert ids_in(any_broker, BILLING, state) == [bystander]


def test_each_step_does_one_page_and_saves_where_the_job_got_to(
    any_broker: Broker, clock: FakeClock, small_pages: int
):
    make_each(any_broker, {S.SCHEDULED: 3, S.PENDING: 2}, queue=SEARCH)
    job = bulk.start(any_broker, SEARCH, Action.DELETE, [S.SCHEDULED, S.PENDING], started_by="alice")

    assert progress(job) == (0, 0, 5, 0, False, S.SCHEDULED)
    assert (job.started_at, job.updated_at, job.started_by, job.pages) == (clock.now, clock.now, "alice", 0)
    assert bulk.get(any_broker, SEARCH, job.id) == job
    steps = [
        (2, 0, 5, 40, False, S.SCHEDULED),
        (3, 0, 5, 60, False, S.PENDING),  # the last scheduled task: on to the next state at once
        (5, 0, 5, 100, True, None),  # the last pending ones: the job ends with its last page
    ]
    for step, expected in enumerate(steps, start=1):
        clock.advance(1)
        job = bulk.carry_on(any_broker, SEARCH, job.id, budget=0)
        assert progress(job) == expected, f"step {step}"
        assert (job.pages, job.updated_at) == (step, clock.now)
        assert bulk.get(any_broker, SEARCH, job.id) == job  # saved after the page
    assert job.finished_at == clock.now
    assert count(any_broker, SEARCH, S.SCHEDULED) + count(any_broker, SEARCH, S.PENDING) == 0
    assert bulk.carry_on(any_broker, SEARCH, job.id, budget=0) == job  # finished: nothing more to do


def test_a_budget_lets_one_call_do_many_pages(any_broker: Broker, small_pages: int):
    make_tasks(any_broker, S.PENDING, SEARCH, count=7)
    job = bulk.start(any_broker, SEARCH, Action.ARCHIVE, [S.PENDING])

    job = bulk.carry_on(any_broker, SEARCH, job.id, budget=10)

    assert (job.finished, job.done, job.pages) == (True, 7, 4)  # pages of 2, 2, 2 and 1
    assert bulk.jobs(any_broker, SEARCH) == [job]


def test_a_later_state_is_counted_when_the_job_reaches_it(any_broker: Broker, small_pages: int):
    make_each(any_broker, {S.SCHEDULED: 2, S.PENDING: 1}, queue=SEARCH)
    job = bulk.start(any_broker, SEARCH, Action.DELETE, [S.SCHEDULED, S.PENDING])
    assert (job.counts, job.total) == ([2, 1], 3)

    job = bulk.carry_on(any_broker, SEARCH, job.id, budget=0)
    assert (job.current_state, job.counts, job.done) == (S.PENDING, [2, 1], 2)  # not counted again yet
    enqueue(any_broker, SEARCH, count=2)  # before the job's first page of the pending state
    job = bulk.carry_on(any_broker, SEARCH, job.id, budget=0)

    assert (job.current_state, job.counts, job.total, job.done) == (S.PENDING, [2, 3], 5, 4)
    job, steps = finish(any_broker, SEARCH, job.id)
    assert (job.done, job.total, steps) == (5, 5, 1)


def test_tasks_added_to_the_state_meanwhile_do_not_keep_the_job_going(any_broker: Broker, small_pages: int):
    first = make_tasks(any_broker, S.PENDING, SEARCH, count=4)
    job = bulk.start(any_broker, SEARCH, Action.ARCHIVE, [S.PENDING])
    added = []

    for _ in range(10):
        job = bulk.carry_on(any_broker, SEARCH, job.id, budget=0)
        if job.finished:
            break
        added += enqueue(any_broker, SEARCH, count=small_pages)  # as many as the job takes per page

    assert (job.finished, job.done, job.total, job.pages) == (True, 4, 4, 2)
    assert sorted(ids_in(any_broker, SEARCH, S.ARCHIVED)) == sorted(first)
    assert sorted(ids_in(any_broker, SEARCH, S.PENDING)) == sorted(added)


def a_worker_claims(broker: Broker, queue: str, task_ids: list[str]) -> None:
    assert claim_ids(broker, queue, limit=len(task_ids)) == task_ids  # the head of pending: the page


def someone_deletes(broker: Broker, queue: str, task_ids: list[str]) -> None:
    assert manual.delete(broker, queue, task_ids) == len(task_ids)


@pytest.mark.parametrize("take", [a_worker_claims, someone_deletes])
def test_a_page_whose_tasks_all_left_the_state_meanwhile_does_not_end_the_job(
    any_broker: Broker, small_pages: int, monkeypatch, take
):
    older = make_tasks(any_broker, S.PENDING, SEARCH, count=5)
    job = bulk.start(any_broker, SEARCH, Action.ARCHIVE, [S.PENDING])
    archive = manual.archive
    taken: list[str] = []

    def archive_after_they_left(broker: Broker, queue: str, task_ids: list[str]) -> int:
        if not taken:  # between the job's ZRANGE and its script, for the first page only
            take(broker, queue, task_ids)
            taken.extend(task_ids)
        return archive(broker, queue, task_ids)

    monkeypatch.setitem(bulk._ACTS, Action.ARCHIVE, archive_after_they_left)

    job = bulk.carry_on(any_broker, SEARCH, job.id, budget=0)

    assert taken == older[:2]
    # The page moved nothing, yet the job goes on: the page counts against the state's size.
    assert (job.finished, job.current_state, job.done, job.remaining, job.pages) == (
        False, S.PENDING, 0, 3, 1,
    )  # fmt: skip
    job, steps = finish(any_broker, SEARCH, job.id)
    assert (job.done, job.total, job.percent, job.pages, steps) == (3, 5, 100, 3, 2)  # pages of 2 and 1
    assert ids_in(any_broker, SEARCH, S.PENDING) == []
    assert sorted(ids_in(any_broker, SEARCH, S.ARCHIVED)) == sorted(older[2:])
    assert sorted(ids_in(any_broker, SEARCH, S.ACTIVE)) == (sorted(taken) if take is a_worker_claims else [])


def test_run_all_skips_workflows_leaves_them_in_place_and_finishes(
    any_broker: Broker, clock: FakeClock, small_pages: int
):
    workflows, tasks = [], []
    for kind in "wwtwtt":  # archived in this order, a second apart
        clock.advance(1)
        if kind == "w":
            workflows += finished_workflows(any_broker, 1)
        else:
            tasks += make_tasks(any_broker, S.ARCHIVED, EMAILS)
    job = bulk.start(any_broker, EMAILS, Action.RUN, [S.ARCHIVED])

    seen = [(job.done, job.skipped, job.offset) for job in iter_steps(any_broker, EMAILS, job.id)]

    # The workflows at the head of the list are paged over: their count is the offset (back to 0
    # once the last page ends the job).
    assert seen == [(0, 2, 2), (1, 3, 3), (3, 3, 0)]
    job = bulk.get(any_broker, EMAILS, job.id)
    assert (job.finished, job.total, job.percent) == (True, 6, 100)
    assert ids_in(any_broker, EMAILS, S.ARCHIVED) == workflows
    assert sorted(ids_in(any_broker, EMAILS, S.PENDING)) == sorted(tasks)


def iter_steps(broker: Broker, queue: str, job_id: str, most: int = 50):
    """Each step of a job, one page at a time, until it finishes."""
    for _ in range(most):
        job = bulk.carry_on(broker, queue, job_id, budget=0)
        yield job
        if job.finished:
            return
    pytest.fail(f"bulk job {job_id} not finished after {most} steps")


REFUSED = [(action, state) for action in BULK_ACTIONS for state in S if state not in ACTION_STATES[action]]


@pytest.mark.parametrize(("action", "state"), REFUSED, ids=[f"{a}-{s}" for a, s in REFUSED])
def test_a_state_the_action_does_not_apply_to_is_refused(
    any_broker: Broker, action: Action, state: TaskState
):
    ids = make_tasks(any_broker, state, EMAILS)
    allowed = ACTION_STATES[action][0]

    with pytest.raises(InvalidStateTransition, match=f"not {state}"):
        bulk.start(any_broker, EMAILS, action, [state])
    with pytest.raises(InvalidStateTransition, match=f"not {state}"):
        bulk.start(any_broker, EMAILS, action, [allowed, state])  # one refused state refuses the job

    assert bulk.jobs(any_broker, EMAILS) == []
    assert ids_in(any_broker, EMAILS, state) == ids


@pytest.mark.parametrize("action", Action)
def test_check_action_is_the_one_check_of_the_table_with_its_one_sentence(action: Action):
    for state in S:
        if state in ACTION_STATES[action]:
            check_action(action, state)
            continue
        with pytest.raises(ActionNotAllowed) as refused:
            check_action(action, state)
        allowed = ", ".join(ACTION_STATES[action])
        assert isinstance(refused.value, InvalidStateTransition)
        assert str(refused.value) == f"{action} applies to {allowed} tasks, not {state}."
        assert (
            refused.value.sentence("rtq_x --all") == f"rtq_x --all applies to {allowed} tasks, not {state}."
        )
        assert refused.value.skip_reason == f"it is {state}; {action} applies to {allowed} tasks"


@pytest.mark.parametrize("state", ACTION_STATES[Action.CANCEL])
def test_cancel_is_not_an_action_on_whole_states(any_broker: Broker, state: TaskState):
    assert Action.CANCEL not in BULK_ACTIONS

    with pytest.raises(InvalidStateTransition, match="one by one"):
        bulk.start(any_broker, EMAILS, "cancel", [state])

    assert bulk.jobs(any_broker, EMAILS) == []


@pytest.mark.parametrize("action", BULK_ACTIONS)
def test_a_job_on_no_state_at_all_is_refused(any_broker: Broker, action: Action):
    ids = make_tasks(any_broker, S.PENDING, EMAILS)

    with pytest.raises(InvalidStateTransition, match="needs at least one state"):
        bulk.start(any_broker, EMAILS, action, [])

    assert bulk.jobs(any_broker, EMAILS) == []
    assert any_broker.client.hlen(any_broker.queue(EMAILS).bulk) == 0  # no record at all
    assert ids_in(any_broker, EMAILS, S.PENDING) == ids


# Who carries a job on: one holder of its lock at a time


def lock_key(broker: Broker, queue: str, job_id: str) -> str:
    return broker.queue(queue).bulk_lock(job_id)


def test_a_job_someone_else_holds_is_left_to_them(any_broker: Broker, small_pages: int):
    ids = make_tasks(any_broker, S.PENDING, SEARCH, count=3)
    job = bulk.start(any_broker, SEARCH, Action.ARCHIVE, [S.PENDING])
    saved = bulk.carry_on(any_broker, SEARCH, job.id, budget=0)
    lock = any_broker.client.lock(lock_key(any_broker, SEARCH, job.id), timeout=60)
    assert lock.acquire(blocking=False)
    try:
        assert bulk.carry_on(any_broker, SEARCH, job.id, budget=10) == saved  # unchanged
        assert count(any_broker, SEARCH, S.PENDING) == 1
    finally:
        lock.release()

    job, _ = finish(any_broker, SEARCH, job.id)

    assert job.done == 3
    assert sorted(ids_in(any_broker, SEARCH, S.ARCHIVED)) == sorted(ids)


def test_of_two_carrying_a_job_on_at_once_only_one_works(any_broker: Broker, small_pages: int, monkeypatch):
    make_tasks(any_broker, S.PENDING, SEARCH, count=4)
    job = bulk.start(any_broker, SEARCH, Action.ARCHIVE, [S.PENDING])
    key = lock_key(any_broker, SEARCH, job.id)
    in_page, go_on = threading.Event(), threading.Event()
    lock_ttls: list[int] = []
    archive = manual.archive

    def archive_when_told(broker: Broker, queue: str, task_ids: list[str]) -> int:
        lock_ttls.append(broker.client.pttl(key))
        in_page.set()
        assert go_on.wait(10)
        return archive(broker, queue, task_ids)

    monkeypatch.setitem(bulk._ACTS, Action.ARCHIVE, archive_when_told)
    first: list[BulkJob] = []
    thread = threading.Thread(
        target=lambda: first.append(bulk.carry_on(any_broker, SEARCH, job.id, budget=0))
    )
    thread.start()
    try:
        assert in_page.wait(10)
        other = bulk.carry_on(any_broker, SEARCH, job.id, budget=10)
        assert (other.done, other.pages) == (0, 0)  # the saved state: this call did nothing
        assert count(any_broker, SEARCH, S.PENDING) == 4
    finally:
        go_on.set()
        thread.join(10)

    assert (first[0].done, first[0].pages) == (2, 1)
    assert 0 < lock_ttls[0] <= bulk.LOCK_SECONDS * 1000  # a holder that dies is replaced after this
    assert not any_broker.client.exists(key)  # released


def test_the_lock_of_a_holder_that_died_expires_and_the_next_one_carries_on(
    any_broker: Broker, small_pages: int, monkeypatch
):
    monkeypatch.setattr(bulk, "LOCK_SECONDS", 0.2)
    ids = make_tasks(any_broker, S.PENDING, SEARCH, count=5)
    job = bulk.start(any_broker, SEARCH, Action.ARCHIVE, [S.PENDING])
    saved = bulk.carry_on(any_broker, SEARCH, job.id, budget=0)
    key = lock_key(any_broker, SEARCH, job.id)
    dead = any_broker.client.lock(key, timeout=bulk.LOCK_SECONDS)
    assert dead.acquire(blocking=False)  # never released: its process died

    assert bulk.carry_on(any_broker, SEARCH, job.id, budget=0) == saved
    wait_for(lambda: not any_broker.client.exists(key), timeout=5, message="the dead holder's lock to expire")
    job, steps = finish(any_broker, SEARCH, job.id)

    assert (job.done, job.total, steps) == (5, 5, 2)  # from the saved position: pages of 2 and 1
    assert sorted(ids_in(any_broker, SEARCH, S.ARCHIVED)) == sorted(ids)


def test_a_page_a_dead_holder_did_but_did_not_save_is_not_acted_on_twice(
    any_broker: Broker, small_pages: int
):
    ids = make_tasks(any_broker, S.PENDING, SEARCH, count=5)
    job = bulk.start(any_broker, SEARCH, Action.ARCHIVE, [S.PENDING])
    bulk.carry_on(any_broker, SEARCH, job.id, budget=0)
    manual.archive(any_broker, SEARCH, ids_in(any_broker, SEARCH, S.PENDING)[:2])  # then it died

    job, _ = finish(any_broker, SEARCH, job.id)

    assert job.finished and count(any_broker, SEARCH, S.PENDING) == 0
    assert sorted(ids_in(any_broker, SEARCH, S.ARCHIVED)) == sorted(ids)
    assert job.done == 3  # what the saved pages moved: the unsaved page is not counted


# Purging: deleting every state but active, upstream ones first


def purge(broker: Broker, queue: str) -> BulkJob:
    return finish(broker, queue, bulk.start(broker, queue, Action.DELETE, list(bulk.PURGE_STATES)).id)[0]


def test_a_purge_deletes_every_task_but_the_active_ones_page_by_page(any_broker: Broker, small_pages: int):
    sizes = {
        S.SCHEDULED: 3, S.RETRY: 2, S.ARCHIVED: 3, S.COMPLETED: 1, S.ACTIVE: 2, S.PENDING: 5, S.WAITING: 3,
    }  # fmt: skip
    made = make_each(any_broker, sizes, queue=SEARCH)
    [bystander] = make_tasks(any_broker, S.PENDING, BILLING)

    job = purge(any_broker, SEARCH)

    assert job.states == [S.WAITING, S.SCHEDULED, S.RETRY, S.PENDING, S.ARCHIVED, S.COMPLETED]
    assert job.counts == [sizes[state] for state in job.states]
    assert job.done == job.total == sum(sizes.values()) - sizes[S.ACTIVE]
    assert {state: count(any_broker, SEARCH, state) for state in S} == {s: int(s == S.ACTIVE) * 2 for s in S}
    for state, ids in made.items():
        for task_id in ids:
            assert bool(holds_columns(any_broker, SEARCH, task_id)) == (state == S.ACTIVE)
    qk = any_broker.queue(SEARCH)
    assert not any(any_broker.client.exists(qk.workflow(i), qk.workflow_results(i)) for i in made[S.WAITING])
    assert ids_in(any_broker, BILLING, S.PENDING) == [bystander]


def test_a_purge_releases_uniqueness_locks(any_broker: Broker):
    [pending] = enqueue(any_broker, EMAILS, unique_key="report", unique_ttl=60)
    [retrying] = make_tasks(any_broker, S.RETRY, BILLING, unique_key="invoice", unique_ttl=60)

    def holders() -> tuple[str | None, str | None]:
        return lock_holder(any_broker, EMAILS, "report"), lock_holder(any_broker, BILLING, "invoice")

    assert holders() == (pending, retrying)

    purge(any_broker, EMAILS)
    purge(any_broker, BILLING)

    assert holders() == (None, None)


def test_a_purge_of_a_queue_with_only_active_tasks_deletes_nothing(any_broker: Broker):
    [active] = make_tasks(any_broker, S.ACTIVE, EMAILS)

    for queue in (EMAILS, SEARCH):
        started = bulk.start(any_broker, queue, Action.DELETE, bulk.PURGE_STATES)
        job, steps = finish(any_broker, queue, started.id)
        assert (job.done, job.total, job.counts, steps) == (0, 0, [0] * 6, 6)  # one look per state
    assert ids_in(any_broker, EMAILS, S.ACTIVE) == [active]


# The jobs' records


def test_finished_jobs_are_forgotten_after_a_while_and_unreadable_ones_at_once(
    any_broker: Broker, clock: FakeClock
):
    def finished_job(queue: str) -> BulkJob:
        return finish(any_broker, queue, bulk.start(any_broker, queue, Action.DELETE, [S.PENDING]).id)[0]

    finished_job(EMAILS)  # `old`
    idle = bulk.start(any_broker, EMAILS, Action.DELETE, [S.PENDING])  # never carried on
    elsewhere = finished_job(BILLING)
    any_broker.client.hset(any_broker.queue(EMAILS).bulk, "garbage", "not json")
    clock.advance(bulk.KEEP_FINISHED_SECONDS - 1)
    recent = finished_job(EMAILS)
    clock.advance(1)

    assert bulk.forget_finished(any_broker, EMAILS) == 1  # the garbage; `old` finished just as long ago
    clock.advance(1)
    assert bulk.forget_finished(any_broker, EMAILS) == 1  # `old`

    assert [job.id for job in bulk.jobs(any_broker, EMAILS)] == [recent.id, idle.id]  # the latest first
    assert bulk.jobs(any_broker, BILLING) == [elsewhere]  # another queue's jobs are its own
    assert bulk.forget_finished(any_broker, EMAILS) == 0


def malformed_records(valid: str) -> list[str]:
    data = json.loads(valid)
    return [
        "not json",
        "null",
        "[]",
        '{"id": "x"}',
        json.dumps({**data, "action": "explode"}),
        json.dumps({**data, "states": ["nowhere"]}),
        json.dumps({**data, "unknown": 1}),
    ]


def test_a_malformed_job_record_is_ignored(any_broker: Broker):
    good = bulk.start(any_broker, EMAILS, Action.ARCHIVE, [S.PENDING])
    bad = malformed_records(good.to_json())
    records = {f"bad-{i}": raw for i, raw in enumerate(bad)}
    any_broker.client.hset(any_broker.queue(EMAILS).bulk, mapping=records)

    assert bulk.jobs(any_broker, EMAILS) == [good]
    for i in range(len(bad)):
        assert bulk.get(any_broker, EMAILS, f"bad-{i}") is None
        assert bulk.carry_on(any_broker, EMAILS, f"bad-{i}", budget=0) is None
    assert bulk.get(any_broker, EMAILS, "unknown") is None
    assert bulk.carry_on(any_broker, EMAILS, "unknown", budget=0) is None


# The worker's bulk runner


def test_the_bulk_runner_carries_on_the_unfinished_jobs_of_its_queues(
    any_broker: Broker, clock: FakeClock, small_pages: int
):
    gone, _ = finish(any_broker, EMAILS, bulk.start(any_broker, EMAILS, Action.DELETE, [S.RETRY]).id)
    clock.advance(bulk.KEEP_FINISHED_SECONDS + 1)
    jobs = {}
    for queue in (EMAILS, SEARCH, BILLING):
        make_tasks(any_broker, S.PENDING, queue, count=3)
        jobs[queue] = bulk.start(any_broker, queue, Action.ARCHIVE, [S.PENDING])
    runner = BulkRunner(broker=any_broker, queues=[EMAILS, SEARCH], interval=1.0, budget=0)

    def done() -> dict[str, tuple[int, bool]]:
        return {q: ((j := bulk.get(any_broker, q, job.id)).done, j.finished) for q, job in jobs.items()}

    assert runner.run_once() == 2
    assert done() == {EMAILS: (2, False), SEARCH: (2, False), BILLING: (0, False)}  # not its queue
    assert bulk.get(any_broker, EMAILS, gone.id) is None  # finished an hour ago: forgotten
    assert (runner.run_once(), runner.run_once()) == (2, 0)
    assert done() == {EMAILS: (3, True), SEARCH: (3, True), BILLING: (0, False)}


def test_a_worker_finishes_a_job_that_a_request_started(broker: Broker, run_worker, monkeypatch):
    monkeypatch.setattr(bulk, "PAGE", 10)
    ids = make_tasks(broker, S.SCHEDULED, "default", count=45)  # due in a minute: the worker leaves them
    job = Operations(broker=broker).start_bulk(Action.ARCHIVE, "default", [S.SCHEDULED], budget=0)
    assert (job.done, job.finished) == (10, False)

    with run_worker(queues={"default": 1}):
        job = wait_for(
            lambda: (found := bulk.get(broker, "default", job.id)).finished and found,
            timeout=15,
            message="the worker to finish the bulk job",
        )

    assert (job.done, job.total, job.percent) == (45, 45, 100)
    assert sorted(ids_in(broker, "default", S.ARCHIVED)) == sorted(ids)

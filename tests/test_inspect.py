"""The Inspector on a real Redis, standalone and cluster: what the admin and the API rely on."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest

from django_rtq.broker import Broker, TaskState, workflow
from django_rtq.broker import inspect as inspect_module
from django_rtq.broker.broker import utc_day
from django_rtq.broker.inspect import CANCELLED, Inspector, QueueStats
from django_rtq.exceptions import InvalidStateTransition, TaskNotFound
from tests.cluster import FakeClock
from tests.test_broker import (
    BILLING,
    EMAILS,
    QUEUES,
    SEARCH,
    WORKER,
    archive_at,
    done,
    enqueue,
    holds_columns,
    ids_in,
    lock_holder,
    make_tasks,
    message,
    next_message,
    subscribed,
)

S = TaskState


@pytest.fixture
def inspector(any_broker: Broker) -> Inspector:
    return Inspector(any_broker)


def make_each(
    broker: Broker, states: dict[TaskState, int], queue: str = EMAILS
) -> dict[TaskState, list[str]]:
    """Make tasks in several states; pending ones last, as making the others claims pending."""
    order = sorted(states, key=lambda state: state == S.PENDING)
    return {state: make_tasks(broker, state, queue, count=states[state]) for state in order}


# Queues


def test_queue_stats_counts_every_state(inspector: Inspector, clock: FakeClock):
    make_each(
        inspector.broker,
        {S.ACTIVE: 1, S.COMPLETED: 1, S.RETRY: 1, S.ARCHIVED: 2, S.SCHEDULED: 2, S.PENDING: 3},
    )
    inspector.pause(EMAILS)
    clock.advance(42)

    stats = inspector.queue_stats(EMAILS)

    assert stats == QueueStats(
        queue=EMAILS, pending=3, active=1, scheduled=2, retry=1, archived=2, completed=1,
        processed_today=4, failed_today=3, paused=True, oldest_pending_age=42.0,
    )  # fmt: skip
    assert stats.size == 10
    assert inspector.queue_stats(SEARCH) == QueueStats(
        queue=SEARCH, pending=0, active=0, scheduled=0, retry=0, archived=0, completed=0,
        processed_today=0, failed_today=0, paused=False, oldest_pending_age=None,
    )  # fmt: skip


def test_queue_stats_counts_today_only(inspector: Inspector, clock: FakeClock):
    make_tasks(inspector.broker, S.ARCHIVED, BILLING)
    inspector.pause(BILLING)
    inspector.resume(BILLING)
    clock.advance(24 * 3600)

    stats = inspector.queue_stats(BILLING)

    assert (stats.archived, stats.processed_today, stats.failed_today, stats.paused) == (1, 0, 0, False)


def test_oldest_pending_age_is_that_of_the_next_task_to_run(inspector: Inspector, clock: FakeClock):
    enqueue(inspector.broker, SEARCH)
    clock.advance(10)
    enqueue(inspector.broker, SEARCH, priority=9, enqueued_at=clock.now)
    clock.advance(5)
    assert inspector.queue_stats(SEARCH).oldest_pending_age == 5.0

    [head] = inspector.list_tasks(SEARCH, S.PENDING, limit=1)
    inspector.client.hset(inspector.broker.queue(SEARCH).msg, head.id, "not json")
    assert inspector.queue_stats(SEARCH).oldest_pending_age is None


def test_history_gives_each_days_counters_oldest_first(inspector: Inspector, clock: FakeClock):
    broker = inspector.broker
    make_tasks(broker, S.RETRY, EMAILS)
    clock.advance(24 * 3600)
    ids = make_tasks(broker, S.ACTIVE, EMAILS, count=2)
    broker.complete(EMAILS, [done(i) for i in ids], worker_id=WORKER)
    clock.advance(24 * 3600)

    history = inspector.history(EMAILS, days=4)

    days = [utc_day(clock.now - timedelta(days=n).total_seconds()) for n in (3, 2, 1, 0)]
    assert history == list(zip(days, [0, 1, 2, 0], [0, 1, 0, 0], strict=True))


def test_queues_and_all_stats_list_every_queue_enqueued_to(inspector: Inspector):
    for queue in QUEUES:
        enqueue(inspector.broker, queue)

    assert inspector.queues() == sorted(QUEUES)
    assert [(s.queue, s.pending) for s in inspector.all_stats()] == [(q, 1) for q in sorted(QUEUES)]
    assert inspector.count(EMAILS, "pending") == 1


def test_workers_are_those_of_the_broker(inspector: Inspector):
    inspector.broker.write_worker("w1", {"id": "w1"}, ttl_seconds=10)

    assert inspector.workers() == [{"id": "w1"}]


# Listing and finding tasks


def test_list_tasks_pages_pending_in_run_order(inspector: Inspector):
    tasks = [message(SEARCH, priority=p) for p in (0, 3, 0, -2, 3)]
    inspector.broker.enqueue(tasks)
    run_order = [tasks[i] for i in (1, 4, 0, 2, 3)]

    pages = [inspector.list_tasks(SEARCH, "pending", offset=offset, limit=2) for offset in (0, 2, 4)]

    assert [len(page) for page in pages] == [2, 2, 1]
    listed = [task for page in pages for task in page]
    assert [task.message for task in listed] == run_order
    assert {(task.state, task.score_at, task.queue) for task in listed} == {(S.PENDING, None, SEARCH)}


def test_list_tasks_shows_scheduled_by_due_time(inspector: Inspector, clock: FakeClock):
    due = [clock.now + delay for delay in (30, 10, 20)]
    inspector.broker.enqueue([message(BILLING, process_at=at) for at in due])

    listed = inspector.list_tasks(BILLING, S.SCHEDULED)

    assert [task.score_at for task in listed] == sorted(due)


def test_list_tasks_shows_archived_newest_first(inspector: Inspector, clock: FakeClock):
    ids = archive_at(inspector.broker, clock, 4)

    first_page = inspector.list_tasks(EMAILS, S.ARCHIVED, limit=3)

    assert [task.id for task in first_page] == ids[:0:-1]
    assert first_page[0].score_at == clock.now - 1
    assert [task.id for task in inspector.list_tasks(EMAILS, S.ARCHIVED, offset=3)] == ids[:1]


def test_list_tasks_shows_what_each_state_keeps(inspector: Inspector, clock: FakeClock):
    broker = inspector.broker
    [completed] = make_tasks(broker, S.COMPLETED, EMAILS)
    [retrying] = make_tasks(broker, S.RETRY, EMAILS)
    [active] = make_tasks(broker, S.ACTIVE, EMAILS)

    [done_task] = inspector.list_tasks(EMAILS, S.COMPLETED)
    [retry_task] = inspector.list_tasks(EMAILS, S.RETRY)
    [active_task] = inspector.list_tasks(EMAILS, S.ACTIVE)

    assert (done_task.id, done_task.result, done_task.score_at) == (completed, None, clock.now + 60)
    assert (retry_task.id, retry_task.last_error, retry_task.retried) == (retrying, "boom", 0)
    assert (active_task.id, active_task.owner, active_task.message.id) == (active, WORKER, active)


def test_get_task_finds_a_task_by_id_in_any_queue(inspector: Inspector):
    states = {EMAILS: S.ARCHIVED, SEARCH: S.PENDING, BILLING: S.ACTIVE}
    made = {queue: make_tasks(inspector.broker, state, queue)[0] for queue, state in states.items()}

    for queue, state in states.items():
        task = inspector.get_task(made[queue])
        assert (task.id, task.queue, task.state) == (made[queue], queue, state)
    assert inspector.get_task(made[SEARCH], queue=SEARCH).queue == SEARCH


def test_get_task_raises_task_not_found(inspector: Inspector):
    [task_id] = enqueue(inspector.broker, EMAILS)

    with pytest.raises(TaskNotFound, match="nope"):
        inspector.get_task("nope")
    with pytest.raises(TaskNotFound, match=BILLING):
        inspector.get_task(task_id, queue=BILLING)


def test_get_task_with_a_corrupt_message(inspector: Inspector):
    [task_id] = enqueue(inspector.broker, EMAILS)
    inspector.client.hset(inspector.broker.queue(EMAILS).msg, task_id, '{"id": 1, "bogus": true}')

    task = inspector.get_task(task_id)

    assert (task.message, task.raw_message) == (None, '{"id": 1, "bogus": true}')


# Acting on given tasks


def test_run_now_moves_scheduled_retry_and_archived_tasks_to_pending(inspector: Inspector):
    broker = inspector.broker
    made = make_each(broker, {S.SCHEDULED: 1, S.RETRY: 1, S.ACTIVE: 1, S.PENDING: 1})
    [urgent] = make_tasks(broker, S.ARCHIVED, EMAILS, priority=50)
    every_id = [urgent, *(task_id for ids in made.values() for task_id in ids), "unknown"]

    assert inspector.run_now(EMAILS, every_id) == 3
    assert inspector.run_now(EMAILS, []) == 0

    pending = ids_in(broker, EMAILS, S.PENDING)
    assert pending[0] == urgent  # its priority still counts
    assert set(pending) == {urgent, *made[S.SCHEDULED], *made[S.RETRY], *made[S.PENDING]}
    assert ids_in(broker, EMAILS, S.ACTIVE) == made[S.ACTIVE]


def test_archive_moves_pending_scheduled_and_retry_tasks(inspector: Inspector, clock: FakeClock):
    broker = inspector.broker
    movable = {S.PENDING: 1, S.SCHEDULED: 1, S.RETRY: 1}
    made = make_each(broker, {**movable, S.ACTIVE: 1, S.COMPLETED: 1})
    clock.advance(7)

    assert inspector.archive(EMAILS, [i for ids in made.values() for i in ids]) == 3
    assert inspector.archive(EMAILS, []) == 0

    archived = {task.id: task.score_at for task in inspector.list_tasks(EMAILS, S.ARCHIVED)}
    assert archived == {made[state][0]: clock.now for state in movable}
    assert ids_in(broker, EMAILS, S.ACTIVE) == made[S.ACTIVE]
    assert ids_in(broker, EMAILS, S.COMPLETED) == made[S.COMPLETED]


def test_delete_removes_tasks_in_any_state_but_active(inspector: Inspector):
    broker = inspector.broker
    made = make_each(broker, dict.fromkeys(S, 1))
    every_id = [task_id for ids in made.values() for task_id in ids]

    assert inspector.delete(EMAILS, every_id) == len(S) - 1  # all but the active one
    assert inspector.delete(EMAILS, []) == 0

    for state, [task_id] in made.items():
        assert bool(holds_columns(broker, EMAILS, task_id)) == (state == S.ACTIVE)
    assert [inspector.count(EMAILS, state) for state in S] == [int(state == S.ACTIVE) for state in S]


# Ending tasks by hand: each records why, feeds the ORM mirror and tells its workflow


def buffered(broker: Broker, queue: str, task_id: str) -> dict[str, Any] | None:
    """The task's record in the ORM mirror's buffer (see buffer_finished in _lib.lua), if any."""
    raw = broker.client.hget(broker.queue(queue).finished, task_id)
    return json.loads(raw) if raw else None


def by_hand(reason: str, at: float) -> dict[str, Any]:
    return {"error_type": CANCELLED, "error": reason, "traceback": "", "failed_at": at}


def test_archive_records_the_reason_and_feeds_the_mirror(inspector: Inspector, clock: FakeClock, monkeypatch):
    broker = inspector.broker
    [retrying] = make_tasks(broker, S.RETRY, EMAILS)
    [pending] = make_tasks(broker, S.PENDING, EMAILS)  # after: making the other claims pending tasks
    attempts = {"retried": 1, "worker": WORKER, "errors": [{"type": "ValueError", "message": "boom"}]}
    inspector.client.hset(broker.queue(EMAILS).info, retrying, json.dumps(attempts))
    monkeypatch.setattr(broker, "mirror", True)
    clock.advance(5)

    assert inspector.archive(EMAILS, [pending, retrying]) == 2

    reason = by_hand("archived by hand", clock.now)
    assert inspector.get_task(pending).info == reason
    assert inspector.get_task(retrying).info == {**attempts, **reason}  # its attempts are kept
    for task_id in (pending, retrying):
        record = buffered(broker, EMAILS, task_id)
        assert (record["status"], record["msg"]["id"]) == ("failed", task_id)
        assert record["finished_at"] == clock.ms()
        assert record["info"] == inspector.get_task(task_id).info


def test_deleting_a_task_that_had_not_finished_records_why_for_the_mirror(
    inspector: Inspector, clock: FakeClock, monkeypatch
):
    broker = inspector.broker
    made = make_each(broker, {S.PENDING: 1, S.SCHEDULED: 1, S.RETRY: 1, S.ARCHIVED: 1, S.COMPLETED: 1})
    monkeypatch.setattr(broker, "mirror", True)

    assert inspector.delete(EMAILS, [task_id for ids in made.values() for task_id in ids]) == 5

    for state, [task_id] in made.items():
        record = buffered(broker, EMAILS, task_id)
        if state in (S.PENDING, S.SCHEDULED, S.RETRY):
            assert record["status"] == "failed"
            assert {k: record["info"][k] for k in ("error_type", "error")} == {
                "error_type": CANCELLED,
                "error": "deleted by hand",
            }
        else:  # recorded (or not, the mirror being off) when it finished
            assert record is None
        assert holds_columns(broker, EMAILS, task_id) == []
    assert [inspector.count(EMAILS, state) for state in S] == [0] * len(S)


def test_with_the_mirror_off_tasks_ended_by_hand_are_not_buffered(inspector: Inspector):
    broker = inspector.broker
    archived, deleted = make_tasks(broker, S.PENDING, EMAILS, count=2)

    assert (inspector.archive(EMAILS, [archived]), inspector.delete(EMAILS, [deleted])) == (1, 1)

    assert inspector.client.hlen(broker.queue(EMAILS).finished) == 0
    assert inspector.get_task(archived).last_error == "archived by hand"


@pytest.mark.parametrize(
    ("action", "reason"), [("archive", "archived by hand"), ("delete", "deleted by hand")]
)
def test_a_workflow_child_ended_by_hand_tells_its_workflow(inspector: Inspector, action: str, reason: str):
    broker = inspector.broker
    [child] = enqueue(broker, EMAILS, parent="wf-1", parent_queue=BILLING, position=3)

    assert getattr(inspector, action)(EMAILS, [child]) == 1

    [(cmd_id, body)] = workflow.take_commands(broker, EMAILS)
    assert cmd_id == f"child:{child}"
    assert json.loads(body) == {
        "type": "child", "to": "wf-1", "to_queue": BILLING, "pos": 3, "child": child, "ok": False,
        "error": {"type": CANCELLED, "message": reason, "traceback": ""},
    }  # fmt: skip


def finished_workflows(broker: Broker, count: int) -> list[str]:
    """Make `count` workflows of EMAILS and cancel them: archived, finished."""
    ids = make_tasks(broker, S.WAITING, EMAILS, count=count)
    for workflow_id in ids:
        assert workflow.cancel_workflow(broker, EMAILS, workflow_id, error_type=CANCELLED, message="x")
    return ids


def test_run_now_refuses_a_finished_workflow(inspector: Inspector):
    broker = inspector.broker
    [finished] = finished_workflows(broker, 1)
    [task_id] = make_tasks(broker, S.ARCHIVED, EMAILS)

    with pytest.raises(InvalidStateTransition, match="a finished workflow cannot be run again"):
        inspector.run_now(EMAILS, [finished])
    assert inspector.run_now(EMAILS, [finished, task_id]) == 1  # among other tasks, it is skipped
    qk = broker.queue(EMAILS)
    keys = [qk.state, qk.priority, qk.pending, qk.seq, qk.scheduled, qk.retry, qk.archived, qk.msg]
    assert broker.run_script("run_now", keys, [qk.wake_channel, finished]) == 0  # the script refuses too

    assert ids_in(broker, EMAILS, S.ARCHIVED) == [finished]
    assert ids_in(broker, EMAILS, S.PENDING) == [task_id]


def test_run_all_skips_workflows_page_by_page(inspector: Inspector, clock: FakeClock, monkeypatch, caplog):
    monkeypatch.setattr(inspect_module, "BULK_PAGE", 2)
    broker = inspector.broker
    workflows, tasks = [], []
    for kind in "wwtwtt":  # archived in this order, a second apart
        clock.advance(1)
        if kind == "w":
            workflows += finished_workflows(broker, 1)
        else:
            tasks += make_tasks(broker, S.ARCHIVED, EMAILS)

    with caplog.at_level(logging.WARNING, logger=inspect_module.__name__):
        assert inspector.run_all(EMAILS, S.ARCHIVED) == 3

    assert ids_in(broker, EMAILS, S.ARCHIVED) == workflows
    assert sorted(ids_in(broker, EMAILS, S.PENDING)) == sorted(tasks)
    assert "3 workflows skipped" in caplog.text


# Acting on a whole state


BULK_ACTIONS = [
    *(("run_all", state, S.PENDING) for state in (S.SCHEDULED, S.RETRY, S.ARCHIVED)),
    *(("archive_all", state, S.ARCHIVED) for state in (S.PENDING, S.SCHEDULED, S.RETRY)),
    *(("delete_all", state, None) for state in S if state != S.ACTIVE),
]


@pytest.mark.parametrize(("action", "state", "target"), BULK_ACTIONS)
def test_a_bulk_action_moves_a_whole_state_page_by_page(
    inspector: Inspector, monkeypatch, action: str, state: TaskState, target: TaskState | None
):
    monkeypatch.setattr(inspect_module, "BULK_PAGE", 2)
    ids = make_tasks(inspector.broker, state, SEARCH, count=5)
    [bystander] = make_tasks(inspector.broker, state, BILLING)

    assert getattr(inspector, action)(SEARCH, state) == 5

    assert inspector.count(SEARCH, state) == 0
    if target is None:
        assert not any(holds_columns(inspector.broker, SEARCH, task_id) for task_id in ids)
    else:
        assert set(ids_in(inspector.broker, SEARCH, target)) == set(ids)
    assert ids_in(inspector.broker, BILLING, state) == [bystander]


REFUSED = [
    ("run_all", S.PENDING),
    ("run_all", S.ACTIVE),
    ("run_all", S.COMPLETED),
    ("archive_all", S.ARCHIVED),
    ("archive_all", S.ACTIVE),
    ("archive_all", S.COMPLETED),
    ("delete_all", S.ACTIVE),
]


@pytest.mark.parametrize(("action", "state"), REFUSED)
def test_a_bulk_action_refuses_a_state_it_does_not_apply_to(
    inspector: Inspector, action: str, state: TaskState
):
    ids = make_tasks(inspector.broker, state, EMAILS)

    with pytest.raises(InvalidStateTransition, match=str(state)):
        getattr(inspector, action)(EMAILS, state)

    assert ids_in(inspector.broker, EMAILS, state) == ids


# Purging


def test_purge_deletes_every_task_but_the_active_ones_page_by_page(inspector: Inspector, monkeypatch):
    monkeypatch.setattr(inspect_module, "BULK_PAGE", 2)
    sizes = {
        S.SCHEDULED: 3, S.RETRY: 2, S.ARCHIVED: 3, S.COMPLETED: 1, S.ACTIVE: 2, S.PENDING: 5, S.WAITING: 3,
    }  # fmt: skip
    made = make_each(inspector.broker, sizes, queue=SEARCH)
    [bystander] = make_tasks(inspector.broker, S.PENDING, BILLING)

    deleted = inspector.purge(SEARCH)

    assert deleted == {state: count for state, count in sizes.items() if state != S.ACTIVE}
    assert list(deleted) == [S.WAITING, S.SCHEDULED, S.RETRY, S.PENDING, S.ARCHIVED, S.COMPLETED]
    assert {state: inspector.count(SEARCH, state) for state in S} == {s: int(s == S.ACTIVE) * 2 for s in S}
    for state, ids in made.items():
        for task_id in ids:
            assert bool(holds_columns(inspector.broker, SEARCH, task_id)) == (state == S.ACTIVE)
    qk = inspector.broker.queue(SEARCH)
    assert not any(inspector.client.exists(qk.workflow(i), qk.workflow_results(i)) for i in made[S.WAITING])
    assert ids_in(inspector.broker, BILLING, S.PENDING) == [bystander]


def test_purge_releases_uniqueness_locks(inspector: Inspector):
    broker = inspector.broker
    [pending] = enqueue(broker, EMAILS, unique_key="report", unique_ttl=60)
    [retrying] = make_tasks(broker, S.RETRY, BILLING, unique_key="invoice", unique_ttl=60)
    assert (lock_holder(broker, EMAILS, "report"), lock_holder(broker, BILLING, "invoice")) == (
        pending,
        retrying,
    )

    inspector.purge(EMAILS)
    inspector.purge(BILLING)

    assert (lock_holder(broker, EMAILS, "report"), lock_holder(broker, BILLING, "invoice")) == (None, None)


def test_purge_of_an_empty_queue_deletes_nothing(inspector: Inspector):
    [active] = make_tasks(inspector.broker, S.ACTIVE, EMAILS)

    assert inspector.purge(EMAILS) == dict.fromkeys(inspect_module.PURGE_ORDER, 0)
    assert inspector.purge(SEARCH) == dict.fromkeys(inspect_module.PURGE_ORDER, 0)
    assert ids_in(inspector.broker, EMAILS, S.ACTIVE) == [active]


# Cancelling


def test_cancel_returns_the_number_of_listeners(inspector: Inspector):
    assert inspector.cancel("task-1") == 0

    with subscribed(inspector.broker, inspector.broker.keys.cancel_channel) as pubsub:
        assert inspector.cancel("task-2") == 1
        assert next_message(pubsub)["data"] == "task-2"

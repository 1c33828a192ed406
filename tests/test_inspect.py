"""The Inspector (reads) and the manual actions by id (broker/manual.py) on a real Redis,
standalone and cluster: what the operations layer, so every surface, relies on."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from django_rtq.broker import Broker, TaskState, manual, workflow
from django_rtq.broker.broker import utc_day
from django_rtq.broker.inspect import Inspector, QueueStats
from django_rtq.broker.manual import CANCELLED
from django_rtq.broker.states import ACTION_STATES, Action
from django_rtq.exceptions import TaskNotFound
from tests.support.clock import FakeClock
from tests.support.factories import (
    BILLING,
    EMAILS,
    QUEUES,
    SEARCH,
    WORKER,
    archive_at,
    done,
    enqueue,
    make_tasks,
    message,
)
from tests.support.reading import holds_columns, ids_in, lock_holder, next_message, subscribed

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
    inspector.broker.pause(EMAILS)
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
    inspector.broker.pause(BILLING)
    inspector.broker.resume(BILLING)
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


def test_locate_finds_ids_in_every_queue_and_leaves_out_missing_ones(inspector: Inspector):
    broker = inspector.broker
    [archived] = make_tasks(broker, S.ARCHIVED, EMAILS)
    [active] = make_tasks(broker, S.ACTIVE, BILLING)
    [twice] = enqueue(broker, SEARCH)
    broker.enqueue([message(BILLING, id=twice, process_at=broker.clock() + 60)])  # one id, two queues
    broker.client.hset(broker.queue(EMAILS).state, "odd", "bogus")  # not a state: not a task

    ids = [archived, active, twice, "missing", "odd"]

    assert inspector.locate(ids) == {
        archived: (EMAILS, S.ARCHIVED),
        active: (BILLING, S.ACTIVE),
        twice: (BILLING, S.SCHEDULED),  # the first queue in the known order wins
    }
    assert inspector.locate(ids, queue=SEARCH) == {twice: (SEARCH, S.PENDING)}
    assert inspector.locate(ids, queue=EMAILS) == {archived: (EMAILS, S.ARCHIVED)}
    assert inspector.locate([]) == {}
    assert inspector.locate(["missing"], queue="nowhere") == {}


def test_get_task_with_a_corrupt_message(inspector: Inspector):
    [task_id] = enqueue(inspector.broker, EMAILS)
    inspector.client.hset(inspector.broker.queue(EMAILS).msg, task_id, '{"id": 1, "bogus": true}')

    task = inspector.get_task(task_id)

    assert (task.message, task.raw_message) == (None, '{"id": 1, "bogus": true}')


# Acting on given tasks (broker/manual.py): each action moves the states ACTION_STATES allows


def test_run_now_moves_scheduled_retry_and_archived_tasks_to_pending(inspector: Inspector):
    broker = inspector.broker
    made = make_each(broker, {S.SCHEDULED: 1, S.RETRY: 1, S.ACTIVE: 1, S.PENDING: 1})
    [urgent] = make_tasks(broker, S.ARCHIVED, EMAILS, priority=50)
    every_id = [urgent, *(task_id for ids in made.values() for task_id in ids), "unknown"]

    assert manual.run_now(broker, EMAILS, every_id) == 3
    assert manual.run_now(broker, EMAILS, []) == 0

    pending = ids_in(broker, EMAILS, S.PENDING)
    assert pending[0] == urgent  # its priority still counts
    assert set(pending) == {urgent, *made[S.SCHEDULED], *made[S.RETRY], *made[S.PENDING]}
    assert ids_in(broker, EMAILS, S.ACTIVE) == made[S.ACTIVE]


def test_archive_moves_pending_scheduled_and_retry_tasks(inspector: Inspector, clock: FakeClock):
    broker = inspector.broker
    movable = {S.PENDING: 1, S.SCHEDULED: 1, S.RETRY: 1}
    made = make_each(broker, {**movable, S.ACTIVE: 1, S.COMPLETED: 1})
    clock.advance(7)

    assert manual.archive(broker, EMAILS, [i for ids in made.values() for i in ids]) == 3
    assert manual.archive(broker, EMAILS, []) == 0

    archived = {task.id: task.score_at for task in inspector.list_tasks(EMAILS, S.ARCHIVED)}
    assert archived == {made[state][0]: clock.now for state in movable}
    assert ids_in(broker, EMAILS, S.ACTIVE) == made[S.ACTIVE]
    assert ids_in(broker, EMAILS, S.COMPLETED) == made[S.COMPLETED]


def test_delete_removes_tasks_in_any_state_but_active(inspector: Inspector):
    broker = inspector.broker
    made = make_each(broker, dict.fromkeys(S, 1))
    every_id = [task_id for ids in made.values() for task_id in ids]

    assert manual.delete(broker, EMAILS, every_id) == len(S) - 1  # all but the active one
    assert manual.delete(broker, EMAILS, []) == 0

    for state, [task_id] in made.items():
        assert bool(holds_columns(broker, EMAILS, task_id)) == (state == S.ACTIVE)
    assert [inspector.count(EMAILS, state) for state in S] == [int(state == S.ACTIVE) for state in S]


ACTS = {Action.RUN: manual.run_now, Action.ARCHIVE: manual.archive, Action.DELETE: manual.delete}


@pytest.mark.parametrize("action", list(ACTS))
def test_the_scripts_act_on_the_states_the_table_gives_them(
    inspector: Inspector, monkeypatch, action: Action
):
    """The scripts hold no list of states: narrow an action's row and the others are left alone."""
    broker = inspector.broker
    allowed, *others = (state for state in ACTION_STATES[action] if state != S.WAITING)
    monkeypatch.setitem(ACTION_STATES, action, (allowed,))
    made = make_each(broker, {state: 1 for state in (allowed, *others)})

    assert ACTS[action](broker, EMAILS, [task_id for ids in made.values() for task_id in ids]) == 1

    assert ids_in(broker, EMAILS, allowed) == []
    for state in others:
        assert ids_in(broker, EMAILS, state) == made[state]


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

    assert manual.archive(broker, EMAILS, [pending, retrying]) == 2

    reason = by_hand(manual.ARCHIVED_BY_HAND, clock.now)
    assert inspector.get_task(pending).info == reason
    assert inspector.get_task(retrying).info == {**attempts, **reason}  # its attempts are kept
    for task_id in (pending, retrying):
        record = buffered(broker, EMAILS, task_id)
        assert record["status"] == "failed"
        assert record["msg"] == json.loads(inspector.get_task(task_id).raw_message)
        assert record["finished_at"] == clock.ms()
        assert record["info"] == inspector.get_task(task_id).info


def test_archive_records_the_reason_it_is_given(inspector: Inspector, clock: FakeClock):
    [pending] = make_tasks(inspector.broker, S.PENDING, EMAILS)

    assert manual.archive(inspector.broker, EMAILS, [pending], reason="its workflow failed") == 1

    assert inspector.get_task(pending).info == by_hand("its workflow failed", clock.now)


def test_deleting_a_task_that_had_not_finished_records_why_for_the_mirror(
    inspector: Inspector, clock: FakeClock, monkeypatch
):
    broker = inspector.broker
    made = make_each(broker, {S.PENDING: 1, S.SCHEDULED: 1, S.RETRY: 1, S.ARCHIVED: 1, S.COMPLETED: 1})
    monkeypatch.setattr(broker, "mirror", True)

    assert manual.delete(broker, EMAILS, [task_id for ids in made.values() for task_id in ids]) == 5

    for state, [task_id] in made.items():
        record = buffered(broker, EMAILS, task_id)
        if state in (S.PENDING, S.SCHEDULED, S.RETRY):
            assert record["status"] == "failed"
            assert {k: record["info"][k] for k in ("error_type", "error")} == {
                "error_type": CANCELLED,
                "error": manual.DELETED_BY_HAND,
            }
        else:  # recorded (or not, the mirror being off) when it finished
            assert record is None
        assert holds_columns(broker, EMAILS, task_id) == []
    assert [inspector.count(EMAILS, state) for state in S] == [0] * len(S)


def test_with_the_mirror_off_tasks_ended_by_hand_are_not_buffered(inspector: Inspector):
    broker = inspector.broker
    archived, deleted = make_tasks(broker, S.PENDING, EMAILS, count=2)

    assert (manual.archive(broker, EMAILS, [archived]), manual.delete(broker, EMAILS, [deleted])) == (1, 1)

    assert inspector.client.hlen(broker.queue(EMAILS).finished) == 0
    assert inspector.get_task(archived).last_error == "archived by hand"


@pytest.mark.parametrize(
    ("act", "reason"), [(manual.archive, "archived by hand"), (manual.delete, "deleted by hand")]
)
def test_a_workflow_child_ended_by_hand_tells_its_workflow(inspector: Inspector, act, reason: str):
    broker = inspector.broker
    [child] = enqueue(broker, EMAILS, parent="wf-1", parent_queue=BILLING, position=3)

    assert act(broker, EMAILS, [child]) == 1

    [(cmd_id, body)] = workflow.take_commands(broker, EMAILS)
    assert cmd_id == f"child:{child}"
    assert json.loads(body) == {
        "type": "child", "to": "wf-1", "to_queue": BILLING, "pos": 3, "child": child, "ok": False,
        "error": {"type": CANCELLED, "message": reason, "traceback": ""},
    }  # fmt: skip


@pytest.mark.parametrize("act", [manual.archive, manual.delete])
def test_ending_a_unique_task_by_hand_releases_its_lock(inspector: Inspector, act):
    broker = inspector.broker
    [pending] = enqueue(broker, EMAILS, unique_key="report", unique_ttl=60)
    [retrying] = make_tasks(broker, S.RETRY, BILLING, unique_key="invoice", unique_ttl=60)

    def holders() -> tuple[str | None, str | None]:
        return lock_holder(broker, EMAILS, "report"), lock_holder(broker, BILLING, "invoice")

    assert holders() == (pending, retrying)

    assert (act(broker, EMAILS, [pending]), act(broker, BILLING, [retrying])) == (1, 1)

    assert holders() == (None, None)


def finished_workflows(broker: Broker, count: int) -> list[str]:
    """Make `count` workflows of EMAILS and cancel them: archived, finished."""
    ids = make_tasks(broker, S.WAITING, EMAILS, count=count)
    for workflow_id in ids:
        assert workflow.cancel_workflow(broker, EMAILS, workflow_id, error_type=CANCELLED, message="x")
    return ids


def test_run_now_skips_a_finished_workflow(inspector: Inspector):
    broker = inspector.broker
    [finished] = finished_workflows(broker, 1)
    [task_id] = make_tasks(broker, S.ARCHIVED, EMAILS)

    assert manual.workflow_ids(broker, EMAILS, [finished, task_id, "unknown"]) == {finished}
    assert manual.run_now(broker, EMAILS, [finished]) == 0
    assert manual.run_now(broker, EMAILS, [finished, task_id]) == 1
    qk = broker.queue(EMAILS)
    keys = [qk.state, qk.priority, qk.pending, qk.seq, qk.msg, qk.info, qk.archived]
    args = [qk.wake_channel, "", "", "", "", 1, S.ARCHIVED, finished]
    assert broker.run_script("run_now", keys, args) == 0  # the script

    assert ids_in(broker, EMAILS, S.ARCHIVED) == [finished]
    assert ids_in(broker, EMAILS, S.PENDING) == [task_id]


# Cancelling


def test_cancel_asks_the_workers_to_stop_a_running_task(inspector: Inspector):
    broker = inspector.broker
    assert manual.cancel(broker, EMAILS, "task-1", S.ACTIVE) == 0  # nobody listening

    with subscribed(broker, broker.keys.cancel_channel) as pubsub:
        assert manual.cancel(broker, EMAILS, "task-2", S.ACTIVE) == 1
        assert next_message(pubsub)["data"] == "task-2"


def test_cancel_ends_a_waiting_workflow_at_once(inspector: Inspector, clock: FakeClock):
    broker = inspector.broker
    [waiting] = make_tasks(broker, S.WAITING, EMAILS)

    assert manual.cancel(broker, EMAILS, waiting, S.WAITING) == 1

    cancelled = inspector.get_task(waiting)
    assert (cancelled.state, cancelled.info["error_type"], cancelled.last_error) == (
        S.ARCHIVED,
        CANCELLED,
        manual.CANCELLED_BY_HAND,
    )
    assert manual.cancel(broker, EMAILS, waiting, S.WAITING) == 0  # it had ended already

"""Every Broker operation against a real Redis: the standalone server and a 3-master cluster.

Time-based behaviour runs on a fake clock (`clock`) that the tests move; only the uniqueness
lock's TTL, which Redis itself expires, is waited for.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from django_rtq.broker import Broker, ClaimedTask, TaskMessage, TaskState, manual
from django_rtq.broker import broker as broker_module
from django_rtq.exceptions import DuplicateTask, TaskIdConflict
from tests.support.clock import FakeClock
from tests.support.factories import (
    BILLING,
    EMAILS,
    LEASE_SECONDS,
    OTHER_WORKER,
    QUEUES,
    SEARCH,
    WORKER,
    archive_at,
    claim,
    claim_ids,
    done,
    enqueue,
    fail,
    make_tasks,
    message,
)
from tests.support.polling import wait_for
from tests.support.reading import (
    column,
    counter,
    holds_columns,
    ids_in,
    lock_holder,
    next_message,
    scores_in,
    state_of,
    subscribed,
)

# The setup


def test_the_queues_land_on_three_different_cluster_nodes(cluster_broker: Broker):
    client = cluster_broker.client
    nodes = {client.get_node_from_key(cluster_broker.queue(q).pending).name for q in QUEUES}
    assert len(nodes) == 3


def test_ping(any_broker: Broker):
    assert any_broker.ping() is True


# Enqueueing


def test_enqueue_puts_a_task_in_pending(any_broker: Broker):
    task = message(SEARCH)
    any_broker.enqueue([task])

    assert ids_in(any_broker, SEARCH, TaskState.PENDING) == [task.id]
    assert state_of(any_broker, SEARCH, task.id) == "pending"
    assert TaskMessage.from_json(column(any_broker, SEARCH, "msg", task.id), id=task.id, queue=SEARCH) == task
    assert any_broker.known_queues() == [SEARCH]


def test_enqueue_with_process_at_schedules_a_future_task_only(any_broker: Broker, clock: FakeClock):
    later = message(BILLING, process_at=clock.now + 60)
    past = message(BILLING, process_at=clock.now - 1)
    any_broker.enqueue([later, past])

    assert scores_in(any_broker, BILLING, TaskState.SCHEDULED) == {later.id: clock.ms(60)}
    assert state_of(any_broker, BILLING, later.id) == "scheduled"
    assert ids_in(any_broker, BILLING, TaskState.PENDING) == [past.id]


def test_tasks_run_by_priority_then_in_enqueue_order(any_broker: Broker):
    priorities = [0, 5, -3, 5, 0, 100, -100]
    first = [message(EMAILS, priority=p) for p in priorities]
    second = [message(EMAILS, priority=p) for p in (5, 0)]
    any_broker.enqueue(first)
    any_broker.enqueue(second)

    run_order = sorted(first + second, key=lambda task: -task.priority)  # stable: FIFO within
    assert claim_ids(any_broker, EMAILS) == [task.id for task in run_order]


def test_a_taken_id_raises_and_writes_nothing_of_its_chunk(any_broker: Broker):
    [taken] = enqueue(any_broker, SEARCH)
    batch = [message(SEARCH), message(SEARCH, priority=3), message(SEARCH, id=taken)]

    with pytest.raises(TaskIdConflict, match=taken):
        any_broker.enqueue(batch)

    assert ids_in(any_broker, SEARCH, TaskState.PENDING) == [taken]
    for task in batch[:2]:
        assert holds_columns(any_broker, SEARCH, task.id) == []


def test_an_id_twice_in_one_call_raises(any_broker: Broker):
    twin = message(EMAILS)

    with pytest.raises(TaskIdConflict):
        any_broker.enqueue([twin, message(EMAILS, id=twin.id)])

    assert ids_in(any_broker, EMAILS, TaskState.PENDING) == []


def test_a_conflict_leaves_the_chunks_before_it_written(any_broker: Broker, monkeypatch):
    monkeypatch.setattr(broker_module, "ENQUEUE_CHUNK", 2)
    [taken] = enqueue(any_broker, EMAILS)
    batch = [message(EMAILS) for _ in range(3)] + [message(EMAILS, id=taken)]

    with pytest.raises(TaskIdConflict):
        any_broker.enqueue(batch)

    assert set(ids_in(any_broker, EMAILS, TaskState.PENDING)) == {taken, batch[0].id, batch[1].id}


def test_a_held_unique_key_raises_duplicate_task(any_broker: Broker):
    [holder] = enqueue(any_broker, BILLING, unique_key="invoice-7", unique_ttl=60)
    latecomer = message(BILLING, unique_key="invoice-7", unique_ttl=60)

    with pytest.raises(DuplicateTask, match="invoice-7"):
        any_broker.enqueue([message(BILLING), latecomer])

    assert ids_in(any_broker, BILLING, TaskState.PENDING) == [holder]
    assert lock_holder(any_broker, BILLING, "invoice-7") == holder
    # Locks are per queue.
    enqueue(any_broker, SEARCH, unique_key="invoice-7", unique_ttl=60)


def test_a_unique_key_twice_in_one_call_raises_duplicate_task(any_broker: Broker):
    batch = [message(BILLING, unique_key="k", unique_ttl=60) for _ in range(2)]

    with pytest.raises(DuplicateTask):
        any_broker.enqueue(batch)

    assert ids_in(any_broker, BILLING, TaskState.PENDING) == []
    assert lock_holder(any_broker, BILLING, "k") is None


def complete_it(broker: Broker, task_id: str, unique_key: str) -> None:
    claim(broker, BILLING)
    assert broker.complete(BILLING, [done(task_id, unique_key=unique_key)], worker_id=WORKER) == 1


def fail_to_archive(broker: Broker, task_id: str, unique_key: str) -> None:
    claim(broker, BILLING)
    assert fail(broker, BILLING, task_id, TaskState.ARCHIVED, unique_key=unique_key)


def archive_by_hand(broker: Broker, task_id: str, unique_key: str) -> None:
    assert manual.archive(broker, BILLING, [task_id]) == 1


def delete_by_hand(broker: Broker, task_id: str, unique_key: str) -> None:
    assert manual.delete(broker, BILLING, [task_id]) == 1


@pytest.mark.parametrize("release", [complete_it, fail_to_archive, archive_by_hand, delete_by_hand])
def test_the_unique_lock_is_released_when_the_task_is_done_with(
    any_broker: Broker, release: Callable[[Broker, str, str], None]
):
    [task_id] = enqueue(any_broker, BILLING, unique_key="report", unique_ttl=60)
    assert lock_holder(any_broker, BILLING, "report") == task_id

    release(any_broker, task_id, "report")

    assert lock_holder(any_broker, BILLING, "report") is None
    enqueue(any_broker, BILLING, unique_key="report", unique_ttl=60)


def test_the_unique_lock_is_kept_while_the_task_waits_to_retry(any_broker: Broker):
    [task_id] = make_tasks(any_broker, TaskState.RETRY, BILLING, unique_key="report", unique_ttl=60)

    assert lock_holder(any_broker, BILLING, "report") == task_id
    with pytest.raises(DuplicateTask):
        enqueue(any_broker, BILLING, unique_key="report", unique_ttl=60)


def test_the_unique_lock_expires_with_its_ttl(any_broker: Broker):
    enqueue(any_broker, EMAILS, unique_key="digest", unique_ttl=0.05)
    assert 0 < any_broker.client.pttl(any_broker.queue(EMAILS).unique("digest")) <= 50

    def enqueued_again() -> bool:
        try:
            enqueue(any_broker, EMAILS, unique_key="digest", unique_ttl=60)
        except DuplicateTask:
            return False
        return True

    wait_for(enqueued_again, timeout=5, message="the uniqueness lock to expire")


def test_a_task_releases_only_a_lock_it_holds(any_broker: Broker):
    [first] = enqueue(any_broker, EMAILS, unique_key="digest", unique_ttl=60)
    claim(any_broker, EMAILS)
    any_broker.client.delete(any_broker.queue(EMAILS).unique("digest"))  # as if it expired
    [second] = enqueue(any_broker, EMAILS, unique_key="digest", unique_ttl=60)

    any_broker.complete(EMAILS, [done(first, unique_key="digest")], worker_id=WORKER)

    assert lock_holder(any_broker, EMAILS, "digest") == second


def test_bulk_enqueue_fills_several_queues_in_one_call(any_broker: Broker, monkeypatch):
    monkeypatch.setattr(broker_module, "ENQUEUE_CHUNK", 2)
    batch = [message(queue) for queue in QUEUES for _ in range(3)]

    any_broker.enqueue(batch)

    for queue in QUEUES:
        assert ids_in(any_broker, queue, TaskState.PENDING) == [m.id for m in batch if m.queue == queue]
    assert any_broker.known_queues() == sorted(QUEUES)


# Claiming


def test_claim_moves_tasks_to_active_under_a_lease(any_broker: Broker, clock: FakeClock):
    task = message(SEARCH)
    any_broker.enqueue([task])

    [claimed] = claim(any_broker, SEARCH, lease=30)

    assert claimed == ClaimedTask(id=task.id, queue=SEARCH, raw_message=task.to_json(), info={}, run="1")
    assert scores_in(any_broker, SEARCH, TaskState.ACTIVE) == {task.id: clock.ms(30)}
    assert column(any_broker, SEARCH, "owner", task.id) == WORKER
    assert state_of(any_broker, SEARCH, task.id) == "active"
    assert ids_in(any_broker, SEARCH, TaskState.PENDING) == []


def test_claim_takes_at_most_limit_tasks(any_broker: Broker):
    ids = enqueue(any_broker, EMAILS, 5)

    assert claim_ids(any_broker, EMAILS, limit=2) == ids[:2]
    assert ids_in(any_broker, EMAILS, TaskState.PENDING) == ids[2:]
    assert claim_ids(any_broker, SEARCH) == []


def test_a_paused_queue_yields_nothing_until_resumed(any_broker: Broker):
    [paused_task] = enqueue(any_broker, EMAILS)
    [other_task] = enqueue(any_broker, SEARCH)

    any_broker.pause(EMAILS)
    assert any_broker.is_paused(EMAILS)
    assert not any_broker.is_paused(SEARCH)
    assert claim_ids(any_broker, EMAILS) == []
    assert claim_ids(any_broker, SEARCH) == [other_task]

    any_broker.resume(EMAILS)
    assert not any_broker.is_paused(EMAILS)
    assert claim_ids(any_broker, EMAILS) == [paused_task]


def test_claim_returns_the_attempt_facts(any_broker: Broker, clock: FakeClock):
    [task_id] = make_tasks(any_broker, TaskState.RETRY, EMAILS)
    clock.advance(60)
    any_broker.forward(EMAILS)

    [claimed] = claim(any_broker, EMAILS)

    assert claimed.id == task_id
    assert claimed.info == {"error": "boom"}


def test_claim_of_a_task_without_message_gives_none(any_broker: Broker):
    [task_id] = enqueue(any_broker, EMAILS)
    any_broker.client.hdel(any_broker.queue(EMAILS).msg, task_id)

    [claimed] = claim(any_broker, EMAILS)

    assert claimed.id == task_id
    assert claimed.raw_message is None


# Completing


def test_complete_with_retention_keeps_the_task_and_its_result(any_broker: Broker, clock: FakeClock):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, SEARCH)

    settled = any_broker.complete(SEARCH, [done(task_id, retention=60, result=[1, 2])], worker_id=WORKER)

    assert settled == 1
    assert scores_in(any_broker, SEARCH, TaskState.COMPLETED) == {task_id: clock.ms(60)}
    assert state_of(any_broker, SEARCH, task_id) == "completed"
    assert json.loads(column(any_broker, SEARCH, "result", task_id)) == [1, 2]
    assert json.loads(column(any_broker, SEARCH, "info", task_id)) == {"done": True}
    assert column(any_broker, SEARCH, "owner", task_id) is None
    assert ids_in(any_broker, SEARCH, TaskState.ACTIVE) == []


def test_complete_without_retention_deletes_the_task(any_broker: Broker):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, SEARCH, priority=7)

    any_broker.complete(SEARCH, [done(task_id)], worker_id=WORKER)

    assert holds_columns(any_broker, SEARCH, task_id) == []
    for state in TaskState:
        assert ids_in(any_broker, SEARCH, state) == []


def test_complete_counts_processed_tasks(any_broker: Broker):
    ids = make_tasks(any_broker, TaskState.ACTIVE, BILLING, count=3)

    assert any_broker.complete(BILLING, [done(i) for i in ids], worker_id=WORKER) == 3
    assert counter(any_broker, BILLING, "processed") == 3
    assert counter(any_broker, BILLING, "failed") == 0


def test_complete_skips_a_task_the_worker_does_not_hold(any_broker: Broker):
    [theirs] = make_tasks(any_broker, TaskState.ACTIVE, BILLING)

    assert any_broker.complete(BILLING, [done(theirs)], worker_id=OTHER_WORKER) == 0
    assert state_of(any_broker, BILLING, theirs) == "active"
    assert column(any_broker, BILLING, "owner", theirs) == WORKER
    assert counter(any_broker, BILLING, "processed") == 0


# Failing


def test_fail_to_retry_schedules_the_next_attempt(any_broker: Broker, clock: FakeClock):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS)
    info = {"retried": 1, "error": "timeout"}

    assert fail(any_broker, EMAILS, task_id, TaskState.RETRY, retry_at_ms=clock.ms(90), info=info)

    assert scores_in(any_broker, EMAILS, TaskState.RETRY) == {task_id: clock.ms(90)}
    assert state_of(any_broker, EMAILS, task_id) == "retry"
    assert json.loads(column(any_broker, EMAILS, "info", task_id)) == info
    assert column(any_broker, EMAILS, "owner", task_id) is None
    assert ids_in(any_broker, EMAILS, TaskState.ACTIVE) == []


def test_fail_to_archived_and_the_counters(any_broker: Broker, clock: FakeClock):
    [task_id, retried] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS, count=2)
    clock.advance(5)

    assert fail(any_broker, EMAILS, task_id, TaskState.ARCHIVED)
    assert fail(any_broker, EMAILS, retried, TaskState.RETRY, retry_at_ms=clock.ms(1))

    assert scores_in(any_broker, EMAILS, TaskState.ARCHIVED) == {task_id: clock.ms()}
    assert state_of(any_broker, EMAILS, task_id) == "archived"
    assert counter(any_broker, EMAILS, "processed") == 2
    assert counter(any_broker, EMAILS, "failed") == 2


def test_fail_refuses_a_task_the_worker_does_not_hold(any_broker: Broker):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS)

    assert not fail(any_broker, EMAILS, task_id, TaskState.ARCHIVED, worker_id=OTHER_WORKER)
    assert state_of(any_broker, EMAILS, task_id) == "active"
    assert counter(any_broker, EMAILS, "failed") == 0


def recover(
    broker: Broker, queue: str, *, grace_ms: int = 0, max_recoveries: int = 5
) -> list[tuple[str, str]]:
    return broker.recover(queue, grace_ms=grace_ms, max_recoveries=max_recoveries)


def test_recover_takes_back_only_leases_expired_past_the_grace(any_broker: Broker, clock: FakeClock):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS)
    clock.advance(LEASE_SECONDS + 1)

    assert recover(any_broker, EMAILS, grace_ms=2000) == []
    assert state_of(any_broker, EMAILS, task_id) == "active"
    assert recover(any_broker, EMAILS, grace_ms=500) == [(task_id, "recovered")]
    assert state_of(any_broker, EMAILS, task_id) == "pending"
    assert column(any_broker, EMAILS, "owner", task_id) is None
    assert counter(any_broker, EMAILS, "failed") == 0  # a crash is not the task's failure


def test_a_renewed_lease_is_not_recovered(any_broker: Broker, clock: FakeClock):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS)
    clock.advance(LEASE_SECONDS + 1)
    any_broker.extend_leases(EMAILS, [(task_id, True)], worker_id=WORKER)

    assert recover(any_broker, EMAILS) == []
    assert state_of(any_broker, EMAILS, task_id) == "active"


def test_a_late_result_never_overwrites_a_newer_run(any_broker: Broker, clock: FakeClock):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS)  # run 1, by WORKER
    clock.advance(LEASE_SECONDS + 1)
    recover(any_broker, EMAILS)
    assert claim_ids(any_broker, EMAILS, worker=OTHER_WORKER) == [task_id]  # run 2

    assert any_broker.complete(EMAILS, [done(task_id, run="1")], worker_id=WORKER) == 0
    assert not fail(any_broker, EMAILS, task_id, TaskState.ARCHIVED, run="1")
    assert state_of(any_broker, EMAILS, task_id) == "active"
    assert column(any_broker, EMAILS, "owner", task_id) == OTHER_WORKER
    assert any_broker.complete(EMAILS, [done(task_id, run="2")], worker_id=OTHER_WORKER) == 1


def test_a_result_kept_through_an_outage_is_applied_if_nobody_ran_the_task_since(
    any_broker: Broker, clock: FakeClock
):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS)
    clock.advance(LEASE_SECONDS + 1)
    recover(any_broker, EMAILS)  # its lease ran out while the worker could not reach Redis
    assert state_of(any_broker, EMAILS, task_id) == "pending"

    assert any_broker.complete(EMAILS, [done(task_id, retention=60)], worker_id=WORKER) == 1
    assert state_of(any_broker, EMAILS, task_id) == "completed"
    assert ids_in(any_broker, EMAILS, TaskState.PENDING) == []


def test_fail_only_goes_to_retry_or_archived(any_broker: Broker):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, EMAILS)

    with pytest.raises(ValueError, match="retry or archived"):
        fail(any_broker, EMAILS, task_id, TaskState.PENDING)


# Requeueing and leases


def test_requeue_puts_tasks_back_at_the_front(any_broker: Broker):
    claimed = make_tasks(any_broker, TaskState.ACTIVE, SEARCH, count=3)
    waiting = enqueue(any_broker, SEARCH, 2)

    assert any_broker.requeue(SEARCH, claimed[1:], worker_id=WORKER) == 2

    for task_id in claimed[1:]:
        assert state_of(any_broker, SEARCH, task_id) == "pending"
        assert column(any_broker, SEARCH, "owner", task_id) is None
    assert ids_in(any_broker, SEARCH, TaskState.ACTIVE) == claimed[:1]
    assert set(claim_ids(any_broker, SEARCH, limit=2)) == set(claimed[1:])
    assert claim_ids(any_broker, SEARCH) == waiting


def test_requeue_skips_tasks_of_another_worker(any_broker: Broker):
    [task_id] = make_tasks(any_broker, TaskState.ACTIVE, SEARCH)

    assert any_broker.requeue(SEARCH, [task_id], worker_id=OTHER_WORKER) == 0
    assert any_broker.requeue(SEARCH, [], worker_id=WORKER) == 0
    assert state_of(any_broker, SEARCH, task_id) == "active"


def test_extend_leases_extends_only_the_owners_tasks(any_broker: Broker, clock: FakeClock):
    mine = make_tasks(any_broker, TaskState.ACTIVE, BILLING, count=2)
    [theirs] = enqueue(any_broker, BILLING)
    claim(any_broker, BILLING, worker=OTHER_WORKER)
    clock.advance(10)

    extended = any_broker.extend_leases(
        BILLING, [(mine[0], True), (mine[1], True), (theirs, True)], worker_id=WORKER
    )

    assert extended == 2
    leases = scores_in(any_broker, BILLING, TaskState.ACTIVE)
    assert leases == {
        mine[0]: clock.ms(LEASE_SECONDS),
        mine[1]: clock.ms(LEASE_SECONDS),
        theirs: clock.ms(LEASE_SECONDS - 10),
    }


def test_prefetched_tasks_are_unstarted_until_their_start_is_reported(any_broker: Broker, clock: FakeClock):
    ids = enqueue(any_broker, BILLING, 3)
    any_broker.claim(BILLING, worker_id=WORKER, limit=3, start_now=1)
    unstarted = any_broker.queue(BILLING).unstarted
    assert any_broker.client.smembers(unstarted) == set(ids[1:])

    any_broker.extend_leases(BILLING, [(ids[1], True), (ids[2], False)], worker_id=WORKER)
    assert any_broker.client.smembers(unstarted) == {ids[2]}
    clock.advance(LEASE_SECONDS + 1)
    assert sorted(recover(any_broker, BILLING)) == sorted(
        [(ids[0], "recovered"), (ids[1], "recovered"), (ids[2], "requeued")]
    )
    assert any_broker.client.smembers(unstarted) == set()


# Forwarding


def test_forward_moves_only_due_tasks(any_broker: Broker, clock: FakeClock):
    soon = enqueue(any_broker, SEARCH, 2, process_at=clock.now + 10)
    late = enqueue(any_broker, SEARCH, 1, process_at=clock.now + 100)
    [retrying] = make_tasks(any_broker, TaskState.RETRY, SEARCH)  # due in 60 s
    assert any_broker.forward(SEARCH) == 0

    clock.advance(60)

    assert any_broker.forward(SEARCH) == 3
    pending = ids_in(any_broker, SEARCH, TaskState.PENDING)
    assert set(pending[:2]) == set(soon)  # due at the same time: in either order
    assert pending[2] == retrying
    assert ids_in(any_broker, SEARCH, TaskState.SCHEDULED) == late
    assert state_of(any_broker, SEARCH, retrying) == "pending"


def test_forward_keeps_going_past_one_batch(any_broker: Broker, clock: FakeClock):
    scheduled = make_tasks(any_broker, TaskState.SCHEDULED, EMAILS, count=5)
    retrying = make_tasks(any_broker, TaskState.RETRY, EMAILS, count=3)
    clock.advance(60)

    assert any_broker.forward(EMAILS, limit=2) == 8
    assert set(ids_in(any_broker, EMAILS, TaskState.PENDING)) == {*scheduled, *retrying}


# Trimming


def test_trim_deletes_completed_tasks_past_their_retention(any_broker: Broker, clock: FakeClock):
    ended = make_tasks(any_broker, TaskState.COMPLETED, EMAILS, count=3)  # retention 60 s
    clock.advance(30)
    kept = make_tasks(any_broker, TaskState.COMPLETED, EMAILS)
    clock.advance(30)

    assert any_broker.trim(EMAILS, archive_max_age_ms=10**9, archive_max_size=100, limit=2) == 3

    assert ids_in(any_broker, EMAILS, TaskState.COMPLETED) == kept
    for task_id in ended:
        assert holds_columns(any_broker, EMAILS, task_id) == []


def test_trim_deletes_archived_tasks_past_the_max_age(any_broker: Broker, clock: FakeClock):
    ids = archive_at(any_broker, clock, 5)  # archived 5, 4, 3, 2 and 1 s ago

    assert any_broker.trim(EMAILS, archive_max_age_ms=2500, archive_max_size=100, limit=2) == 3

    assert ids_in(any_broker, EMAILS, TaskState.ARCHIVED) == ids[3:]
    assert holds_columns(any_broker, EMAILS, ids[0]) == []


def test_trim_cuts_the_archive_to_its_max_size_oldest_first(any_broker: Broker, clock: FakeClock):
    ids = archive_at(any_broker, clock, 6)

    assert any_broker.trim(EMAILS, archive_max_age_ms=5500, archive_max_size=2, limit=1) == 4

    assert ids_in(any_broker, EMAILS, TaskState.ARCHIVED) == ids[4:]
    assert any_broker.trim(EMAILS, archive_max_age_ms=5500, archive_max_size=2) == 0


# Drained, paused, workers


def test_is_drained(any_broker: Broker, clock: FakeClock):
    assert any_broker.is_drained(QUEUES)
    make_tasks(any_broker, TaskState.SCHEDULED, SEARCH)
    make_tasks(any_broker, TaskState.RETRY, BILLING)
    make_tasks(any_broker, TaskState.ACTIVE, EMAILS)
    assert any_broker.is_drained(QUEUES)

    clock.advance(60)
    assert not any_broker.is_drained([SEARCH])
    assert not any_broker.is_drained([BILLING])
    assert any_broker.is_drained([EMAILS])
    enqueue(any_broker, EMAILS)
    assert not any_broker.is_drained([EMAILS])


def test_enqueue_and_resume_wake_idle_workers(any_broker: Broker):
    with subscribed(any_broker, any_broker.queue(EMAILS).wake_channel) as pubsub:
        enqueue(any_broker, EMAILS)
        assert next_message(pubsub)["data"] == "1"
        enqueue(any_broker, EMAILS)  # pending was not empty: nobody is woken
        any_broker.resume(EMAILS)
        assert next_message(pubsub)["data"] == "1"
        assert pubsub.get_message(timeout=0.05) is None


def test_the_worker_registry(any_broker: Broker, clock: FakeClock):
    any_broker.write_worker("w1", {"id": "w1", "pid": 1}, ttl_seconds=10)
    any_broker.write_worker("w2", {"id": "w2", "pid": 2}, ttl_seconds=30)
    assert sorted(w["id"] for w in any_broker.workers()) == ["w1", "w2"]

    clock.advance(15)
    assert any_broker.workers() == [{"id": "w2", "pid": 2}]

    any_broker.remove_worker("w2")
    assert any_broker.workers() == []
    assert any_broker.client.get(any_broker.keys.worker("w2")) is None


def test_a_script_missing_from_a_node_is_loaded(cluster_broker: Broker):
    # The cluster is this suite's own: flushing its script caches disturbs nobody.
    client = cluster_broker.client
    for node in client.get_nodes():
        client.get_redis_connection(node).script_flush()

    cluster_broker.enqueue([message(SEARCH), message(BILLING)])  # pipelined
    enqueue(cluster_broker, EMAILS)  # on its own

    for queue in QUEUES:
        assert len(claim_ids(cluster_broker, queue)) == 1

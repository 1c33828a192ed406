"""Claiming and settling whole batches: one Redis command per column, however large the batch."""

from __future__ import annotations

from django_rtq.broker import Broker, TaskState
from tests.support.factories import BILLING, EMAILS, WORKER, claim, done, enqueue, make_tasks
from tests.support.reading import column, counter, holds_columns, ids_in, state_of

#: More than one command takes from a list at once (UNPACK_LIMIT in _lib.lua), and not a multiple of it.
BIG_BATCH = 2345


def test_a_batch_larger_than_one_command_takes_is_claimed_whole(any_broker: Broker):
    ids = enqueue(any_broker, EMAILS, BIG_BATCH)
    any_broker.lease_ms = 30_000

    claimed = any_broker.claim(EMAILS, worker_id=WORKER, limit=BIG_BATCH, start_now=1000)

    assert [task.id for task in claimed] == ids
    assert all(task.run == "1" and task.raw_message for task in claimed)
    assert len(ids_in(any_broker, EMAILS, TaskState.ACTIVE)) == BIG_BATCH
    qk = any_broker.queue(EMAILS)
    assert any_broker.client.smembers(qk.unstarted) == set(ids[1000:])
    owners = any_broker.client.hmget(qk.owner, ids)
    assert set(owners) == {WORKER}
    assert set(any_broker.client.hmget(qk.state, ids)) == {"active"}


def test_a_batch_larger_than_one_command_takes_is_settled_whole(any_broker: Broker):
    ids = make_tasks(any_broker, TaskState.ACTIVE, BILLING, count=BIG_BATCH)

    assert any_broker.complete(BILLING, [done(i) for i in ids], worker_id=WORKER) == BIG_BATCH

    assert counter(any_broker, BILLING, "processed") == BIG_BATCH
    assert ids_in(any_broker, BILLING, TaskState.ACTIVE) == []
    qk = any_broker.queue(BILLING)
    for key in qk.columns:
        assert any_broker.client.hlen(key) == 0, key


def test_a_task_named_twice_in_one_batch_is_settled_once(any_broker: Broker):
    [twice, once] = make_tasks(any_broker, TaskState.ACTIVE, BILLING, count=2)

    settled = any_broker.complete(
        BILLING, [done(twice, retention=60), done(once), done(twice, retention=60)], worker_id=WORKER
    )

    assert settled == 2
    assert counter(any_broker, BILLING, "processed") == 2
    assert state_of(any_broker, BILLING, twice) == "completed"
    assert holds_columns(any_broker, BILLING, once) == []


def test_a_batch_settles_only_the_runs_that_still_hold_their_task(any_broker: Broker):
    mine, stolen, late, gone = make_tasks(any_broker, TaskState.ACTIVE, EMAILS, count=4)
    qk = any_broker.queue(EMAILS)
    any_broker.client.hset(qk.owner, stolen, "another-worker")
    any_broker.client.hset(qk.runs, late, "2")  # a newer run of it has started
    any_broker.client.hdel(qk.state, gone)

    settled = any_broker.complete(EMAILS, [done(i) for i in (mine, stolen, late, gone)], worker_id=WORKER)

    assert settled == 1
    assert holds_columns(any_broker, EMAILS, mine) == []
    assert state_of(any_broker, EMAILS, stolen) == "active"
    assert column(any_broker, EMAILS, "owner", stolen) == "another-worker"
    assert state_of(any_broker, EMAILS, late) == "active"
    assert sorted(ids_in(any_broker, EMAILS, TaskState.ACTIVE)) == sorted([stolen, late, gone])


def test_a_batch_settles_runs_given_back_meanwhile_from_pending_and_retry(any_broker: Broker):
    back_in_pending, back_in_retry = make_tasks(any_broker, TaskState.ACTIVE, EMAILS, count=2)
    any_broker.requeue(EMAILS, [back_in_pending], worker_id=WORKER)
    qk = any_broker.queue(EMAILS)
    any_broker.client.zrem(qk.active, back_in_retry)
    any_broker.client.zadd(qk.retry, {back_in_retry: 1})
    any_broker.client.hset(qk.state, back_in_retry, "retry")

    settled = any_broker.complete(EMAILS, [done(back_in_pending), done(back_in_retry)], worker_id=WORKER)

    assert settled == 2
    for state in (TaskState.PENDING, TaskState.RETRY, TaskState.ACTIVE):
        assert ids_in(any_broker, EMAILS, state) == []
    assert holds_columns(any_broker, EMAILS, back_in_pending) == []


def test_claim_reads_each_task_message_and_info_in_order(any_broker: Broker):
    ids = enqueue(any_broker, EMAILS, 3)
    qk = any_broker.queue(EMAILS)
    any_broker.client.hset(qk.info, ids[1], '{"retried": 2}')
    any_broker.client.hdel(qk.msg, ids[2])

    claimed = claim(any_broker, EMAILS)

    assert [task.id for task in claimed] == ids
    assert [task.info for task in claimed] == [{}, {"retried": 2}, {}]
    assert [task.raw_message is None for task in claimed] == [False, False, True]

"""Fair partitions in the broker (docs/partitions.md): claims take partitions in turn, weighted
where asked, and a type's partition limits hold each partition to its own, on the standalone
Redis and the 3-master cluster."""

from __future__ import annotations

from collections import Counter

import pytest

from django_rtq.broker import Broker, TaskState, manual
from django_rtq.broker.limits import FlowLimits, Limit, PartitionLimits, partition_scope
from tests.support.factories import EMAILS, WORKER, done, enqueue

SYNC = "crm.tasks.sync"
OTHER = "crm.tasks.other"


def add(broker: Broker, count: int = 1, partition: str | None = None, **fields) -> list[str]:
    fields.setdefault("task", SYNC)
    return enqueue(broker, EMAILS, count, partition=partition, **fields)


def claim(broker: Broker, limit: int = 10, **options) -> list[str]:
    return [task.id for task in broker.claim(EMAILS, worker_id=WORKER, limit=limit, **options)]


def partitions_of(task_ids: list[str], by_id: dict[str, str | None]) -> list[str | None]:
    return [by_id[task_id] for task_id in task_ids]


def use(broker: Broker, each: Limit | None = None, named: dict[str, Limit] | None = None) -> None:
    flow = FlowLimits(types={}, queues={}, partitions={SYNC: PartitionLimits(each=each, named=named or {})})
    broker.limits = lambda: flow


def test_a_partition_that_comes_after_a_big_one_is_served_in_turn(any_broker):
    big = add(any_broker, 200, "big")
    assert claim(any_broker, 10) == big[:10]
    small = add(any_broker, 5, "small")
    by_id = dict.fromkeys(big, "big") | dict.fromkeys(small, "small")

    taken = claim(any_broker, 10)

    # taken in turn, a task of each partition after the other, from the claims' place on
    assert Counter(partitions_of(taken, by_id)) == {"big": 5, "small": 5}
    assert set(small) <= set(taken)
    assert [t for t in taken if by_id[t] == "big"] == big[10:15]


def test_the_tasks_without_a_partition_are_one_more_lane(any_broker):
    big = add(any_broker, 100, "big")
    assert claim(any_broker, 4) == big[:4]
    plain = add(any_broker, 3, None, task=OTHER)
    late = add(any_broker, 3, "late")

    taken = claim(any_broker, 9)

    assert set(plain) | set(late) <= set(taken)
    assert len(set(taken) & set(big)) == 3


def test_a_backlog_without_a_partition_does_not_hold_back_a_partition(any_broker):
    plain = add(any_broker, 100, None)
    assert claim(any_broker, 4) == plain[:4]
    tenant = add(any_broker, 3, "acme")

    # acme's turns are beside the plain lane's places 6, 7 and 8 (the clock starts at the head's
    # place, 5): a task of each lane per place, in the order of their ids within it
    taken = claim(any_broker, 7)

    assert set(tenant) <= set(taken)
    assert [t for t in taken if t in plain] == plain[4:8]


def test_a_weighted_partition_takes_that_many_turns_per_round(any_broker):
    light = add(any_broker, 40, "light")
    heavy = add(any_broker, 40, "heavy", partition_weight=3)
    by_id = dict.fromkeys(light, "light") | dict.fromkeys(heavy, "heavy")

    taken = claim(any_broker, 20)

    assert Counter(partitions_of(taken, by_id)) == {"heavy": 15, "light": 5}
    assert [t for t in taken if by_id[t] == "light"] == light[:5]  # each partition in its order


def test_priority_still_comes_first(any_broker):
    big = add(any_broker, 20, "big")
    urgent = add(any_broker, 2, "big", priority=10)
    assert claim(any_broker, 2) == urgent
    assert claim(any_broker, 1) == big[:1]


def test_the_lanes_the_claims_passed_are_forgotten(any_broker):
    qk = any_broker.queue(EMAILS)
    tasks = add(any_broker, 1, "a") + add(any_broker, 1, "b")
    assert any_broker.client.zcard(qk.lanes) == 2
    assert sorted(claim(any_broker, 10)) == sorted(tasks)
    assert any_broker.client.zcard(qk.lanes) == 0
    clock = int(any_broker.client.get(qk.vclock))
    assert int(any_broker.client.get(qk.seq)) >= clock  # the lane without a partition starts there too
    again = add(any_broker, 1, "a") + add(any_broker, 1, None)
    assert sorted(claim(any_broker, 10)) == sorted(again)


def test_a_delayed_task_and_a_retry_take_their_partition_turn_when_due(any_broker, clock):
    big = add(any_broker, 50, "big")
    assert claim(any_broker, 4) == big[:4]
    later = add(any_broker, 1, "later", process_at=clock.now + 10)
    clock.advance(11)
    assert any_broker.forward(EMAILS) == 1
    assert later[0] in claim(any_broker, 2)


def test_a_task_run_again_by_hand_takes_its_partition_turn(any_broker):
    big = add(any_broker, 50, "big")
    archived = add(any_broker, 1, "again")
    claimed = claim(any_broker, 60)
    assert archived[0] in claimed
    manual.archive(any_broker, EMAILS, [big[0]])  # (active: not archived by hand)
    any_broker.fail(EMAILS, archived[0], to=TaskState.ARCHIVED, worker_id=WORKER, run="1", info={"error": "x"})
    for task_id in big[:10]:
        any_broker.complete(EMAILS, [done(task_id)], worker_id=WORKER)
    more = add(any_broker, 50, "big")
    assert claim(any_broker, 2) == more[:2]
    assert manual.run_now(any_broker, EMAILS, archived) == 1
    assert archived[0] in claim(any_broker, 2)


def test_each_partition_is_held_to_its_concurrency_limit(any_broker):
    use(any_broker, each=Limit(max_concurrency=2))
    a = add(any_broker, 10, "a")
    b = add(any_broker, 10, "b")

    taken = claim(any_broker, 10)

    assert sorted(taken) == sorted(a[:2] + b[:2])
    assert claim(any_broker, 10) == []
    any_broker.complete(EMAILS, [done(a[0])], worker_id=WORKER)
    assert claim(any_broker, 10) == [a[2]]
    running = any_broker.client.hgetall(any_broker.queue(EMAILS).running)
    assert running == {partition_scope(SYNC, "a"): "2", partition_scope(SYNC, "b"): "2"}


def test_a_partition_named_has_limits_of_its_own(any_broker):
    use(any_broker, each=Limit(max_concurrency=1), named={"premium": Limit(max_concurrency=3)})
    premium = add(any_broker, 5, "premium")
    basic = add(any_broker, 5, "basic")

    taken = claim(any_broker, 10)

    assert sorted(taken) == sorted(premium[:3] + basic[:1])


def test_each_partition_has_a_rate_limit_of_its_own(any_broker, clock):
    use(any_broker, each=Limit(rate=1, period=1.0))
    a = add(any_broker, 3, "a")
    b = add(any_broker, 3, "b")
    first = any_broker.claim(EMAILS, worker_id=WORKER, limit=10)
    assert sorted(t.id for t in first) == sorted([a[0], b[0]])
    assert first.wait == pytest.approx(1.0, abs=0.01)
    assert claim(any_broker, 10) == []
    clock.advance(1)
    assert sorted(claim(any_broker, 10)) == sorted([a[1], b[1]])


def test_tasks_without_a_partition_are_not_held_by_partition_limits(any_broker):
    use(any_broker, each=Limit(max_concurrency=1))
    plain = add(any_broker, 5, None)
    assert sorted(claim(any_broker, 10)) == sorted(plain)

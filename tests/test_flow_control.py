"""Flow control in the broker: rate and concurrency limits per task type and per queue, applied
inside the claim, on the standalone Redis and the 3-master cluster, on a clock the tests move."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from django_rtq.broker import Broker, TaskState, manual
from django_rtq.broker.limits import HELD_BASE, QUEUE_SCOPE, FlowLimits, Limit, make_limit
from tests.support.factories import EMAILS, WORKER, done, enqueue
from tests.support.polling import wait_for

PAY, MAIL = "shop.tasks.pay", "shop.tasks.mail"


def limits(types: dict[str, Limit] | None = None, queue: Limit | None = None) -> FlowLimits:
    return FlowLimits(types=types or {}, queues={EMAILS: queue} if queue else {})


def use(broker: Broker, flow: FlowLimits) -> None:
    broker.limits = lambda: flow


def add(broker: Broker, task: str, count: int = 1, **fields) -> list[str]:
    return enqueue(broker, EMAILS, count, task=task, **fields)


def claim(broker: Broker, limit: int = 10, worker: str = WORKER, start_now: int | None = None):
    return broker.claim(EMAILS, worker_id=worker, limit=limit, start_now=start_now)


def ids(claimed) -> list[str]:
    return [task.id for task in claimed]


def use_of(broker: Broker, scope: str) -> int:
    return int(broker.client.hget(broker.queue(EMAILS).running, scope) or 0)


def held_count(broker: Broker, task: str) -> int:
    return broker.client.zlexcount(broker.queue(EMAILS).held, f"[{task}\0", f"({task}\1")


def test_a_rate_limit_lets_through_one_start_per_interval_and_says_when_the_next(any_broker, clock):
    use(any_broker, limits({PAY: Limit(rate=2, period=1.0)}))
    tasks = add(any_broker, PAY, 4)

    first = claim(any_broker)
    assert ids(first) == tasks[:1]
    assert first.wait == pytest.approx(0.5, abs=0.002)
    assert held_count(any_broker, PAY) == 3
    assert ids(claim(any_broker)) == []

    clock.advance(0.25)
    assert claim(any_broker).wait == pytest.approx(0.25, abs=0.002)
    clock.advance(0.25)
    assert ids(claim(any_broker)) == tasks[1:2]
    clock.advance(10)  # a long pause refills the bucket to its size (burst 1), not beyond
    assert ids(claim(any_broker)) == tasks[2:3]
    assert ids(claim(any_broker)) == []


def test_each_claim_that_takes_the_last_token_says_when_the_next_start_is_allowed(any_broker, clock):
    use(any_broker, limits({PAY: Limit(rate=2, period=1.0)}))
    tasks = add(any_broker, PAY, 4)
    waits = []
    for task in tasks[:3]:
        claimed = claim(any_broker)
        assert ids(claimed) == [task]
        waits.append(claimed.wait)
        clock.advance(0.5)
    assert waits == [pytest.approx(0.5, abs=0.002)] * 3


def test_a_burst_lets_that_many_start_at_once_then_the_rate_applies(any_broker, clock):
    use(any_broker, limits({PAY: Limit(rate=10, period=60.0, burst=3)}))
    tasks = add(any_broker, PAY, 5)
    assert ids(claim(any_broker)) == tasks[:3]
    clock.advance(6)
    assert ids(claim(any_broker)) == tasks[3:4]


def test_tasks_of_other_types_are_not_held_up_behind_a_limited_one(any_broker):
    use(any_broker, limits({PAY: Limit(rate=1, period=3600.0)}))
    pay = add(any_broker, PAY, 50)
    mail = add(any_broker, MAIL, 3)
    assert ids(claim(any_broker, limit=10)) == [pay[0], *mail]
    queue = any_broker.queue(EMAILS)
    scores = dict(any_broker.client.zrange(queue.pending, 0, -1, withscores=True))
    assert set(scores) == set(pay[1:])
    assert all(score >= HELD_BASE for score in scores.values())
    assert all(any_broker.client.hget(queue.state, i) == TaskState.PENDING for i in pay[1:])


def test_a_concurrency_limit_holds_slots_until_the_tasks_leave_active(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=2)}))
    tasks = add(any_broker, PAY, 5)
    running = claim(any_broker)
    assert ids(running) == tasks[:2]
    assert running.wait is None  # a freed slot wakes the workers: no timer
    assert use_of(any_broker, PAY) == 2
    assert ids(claim(any_broker)) == []

    any_broker.complete(EMAILS, [done(tasks[0])], worker_id=WORKER)
    assert use_of(any_broker, PAY) == 1
    assert ids(claim(any_broker)) == tasks[2:3]

    assert any_broker.fail(EMAILS, tasks[1], worker_id=WORKER, run="1", to=TaskState.RETRY, info={})
    assert ids(claim(any_broker)) == tasks[3:4]

    assert any_broker.requeue(EMAILS, [tasks[2]], worker_id=WORKER) == 1
    assert ids(claim(any_broker)) == [tasks[2]]  # back at the front, in its slot again
    assert use_of(any_broker, PAY) == 2
    assert not any_broker.client.hexists(any_broker.queue(EMAILS).slots, tasks[0])


def test_a_dead_workers_slots_come_back_when_its_tasks_are_recovered(any_broker, clock):
    use(any_broker, limits({PAY: Limit(max_concurrency=1)}))
    first, second = add(any_broker, PAY, 2)
    any_broker.lease_ms = 5_000
    assert ids(claim(any_broker, worker="dead")) == [first]
    assert ids(claim(any_broker, worker="alive")) == []

    clock.advance(7)
    recovered = any_broker.recover(EMAILS, grace_ms=1000, max_recoveries=5)
    assert recovered == [(first, "recovered")]
    assert use_of(any_broker, PAY) == 0
    assert ids(claim(any_broker, worker="alive")) == [first]
    assert ids(claim(any_broker, worker="alive")) == []
    assert held_count(any_broker, PAY) == 1 and second


def test_a_freed_slot_wakes_the_idle_workers_when_a_task_waits(broker):
    use(broker, limits({PAY: Limit(max_concurrency=1)}))
    first, _ = add(broker, PAY, 2)
    claim(broker)
    pubsub = broker.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(broker.queue(EMAILS).wake_channel)
    try:
        broker.complete(EMAILS, [done(first)], worker_id=WORKER)
        message = wait_for(lambda: pubsub.get_message(timeout=0.2), timeout=5, message="a wake-up")
        assert message["channel"] == broker.queue(EMAILS).wake_channel
    finally:
        pubsub.close()


def test_held_tasks_start_in_their_priority_order(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=1)}))
    blocker = add(any_broker, PAY)[0]
    assert ids(claim(any_broker)) == [blocker]
    low = add(any_broker, PAY, priority=-5)
    normal = add(any_broker, PAY)
    high = add(any_broker, PAY, priority=7)
    assert ids(claim(any_broker)) == []
    order = []
    last = blocker
    for _ in range(3):
        any_broker.complete(EMAILS, [done(last)], worker_id=WORKER)
        (last,) = ids(claim(any_broker))
        order.append(last)
    assert order == [*high, *normal, *low]


def test_a_queue_limit_caps_every_claim_from_the_queue(any_broker, clock):
    use(any_broker, limits(queue=Limit(rate=1, period=1.0, max_concurrency=2)))
    tasks = add(any_broker, MAIL, 3) + add(any_broker, PAY, 2)
    assert ids(claim(any_broker)) == tasks[:1]
    clock.advance(1)
    assert ids(claim(any_broker)) == tasks[1:2]
    clock.advance(1)
    assert ids(claim(any_broker)) == []  # two running: the queue's concurrency limit
    assert use_of(any_broker, QUEUE_SCOPE) == 2
    any_broker.complete(EMAILS, [done(tasks[0])], worker_id=WORKER)
    assert ids(claim(any_broker)) == tasks[2:3]
    assert any_broker.client.zcard(any_broker.queue(EMAILS).held) == 0  # waits in pending


def test_a_queue_limit_and_a_type_limit_together(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=1)}, queue=Limit(max_concurrency=3)))
    pay = add(any_broker, PAY, 3)
    mail = add(any_broker, MAIL, 3)
    assert ids(claim(any_broker)) == [pay[0], *mail[:2]]
    assert use_of(any_broker, PAY) == 1 and use_of(any_broker, QUEUE_SCOPE) == 3
    slots = any_broker.client.hget(any_broker.queue(EMAILS).slots, pay[0])
    assert sorted(slots.split("\n")) == [QUEUE_SCOPE, PAY]
    any_broker.complete(EMAILS, [done(pay[0])], worker_id=WORKER)
    assert use_of(any_broker, PAY) == 0 and use_of(any_broker, QUEUE_SCOPE) == 2
    assert ids(claim(any_broker)) == [pay[1]]


def test_limits_changed_by_a_deploy_apply_from_the_next_claim(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=1)}))
    tasks = add(any_broker, PAY, 6)
    assert ids(claim(any_broker)) == tasks[:1]
    assert held_count(any_broker, PAY) == 5

    use(any_broker, limits({PAY: Limit(max_concurrency=3)}))
    assert ids(claim(any_broker)) == tasks[1:3]

    use(any_broker, limits())  # the limit removed: what it held goes back and starts
    assert ids(claim(any_broker)) == tasks[3:]
    assert any_broker.client.zcard(any_broker.queue(EMAILS).held) == 0
    any_broker.complete(EMAILS, [done(i) for i in tasks], worker_id=WORKER)
    assert use_of(any_broker, PAY) == 0  # slots taken under the old limits are given back too


def test_limited_tasks_are_claimed_only_to_start_at_once(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=10)}))
    mail = add(any_broker, MAIL)
    pay = add(any_broker, PAY, 3)
    assert ids(claim(any_broker, limit=10, start_now=2)) == [*mail, pay[0]]
    assert any_broker.client.zscore(any_broker.queue(EMAILS).pending, pay[1]) < HELD_BASE


def test_a_task_a_limit_may_hold_back_is_never_handed_to_an_idle_worker(broker):
    use(broker, limits({PAY: Limit(rate=100, period=1.0)}))
    assert claim(broker) == []
    broker.claim(EMAILS, worker_id=WORKER, limit=10, idle_for_ms=60_000)  # now registered as idle
    pubsub = broker.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(broker.queue(EMAILS).handoff_prefix + WORKER)
    try:
        (other,) = add(broker, MAIL)
        assert broker.client.hget(broker.queue(EMAILS).state, other) == TaskState.ACTIVE  # handed over
        broker.claim(EMAILS, worker_id=WORKER, limit=10, idle_for_ms=60_000)  # idle again
        (task,) = add(broker, PAY)
        assert broker.client.hget(broker.queue(EMAILS).state, task) == TaskState.PENDING
        assert broker.client.zscore(broker.queue(EMAILS).idle, WORKER)  # still idle: not handed to it
    finally:
        pubsub.close()


def test_a_held_task_deleted_by_hand_leaves_nothing_behind(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=1)}))
    tasks = add(any_broker, PAY, 3)
    claim(any_broker)
    assert manual.delete(any_broker, EMAILS, [tasks[1]]) == 1
    any_broker.complete(EMAILS, [done(tasks[0])], worker_id=WORKER)
    assert ids(claim(any_broker)) == [tasks[2]]
    assert any_broker.client.zcard(any_broker.queue(EMAILS).held) == 0


def test_without_limits_the_claim_keeps_its_reply_and_touches_no_flow_key(any_broker):
    use(any_broker, limits())  # the test project's limited types would apply otherwise
    tasks = add(any_broker, PAY, 2)
    claimed = claim(any_broker)
    assert ids(claimed) == tasks and claimed.wait is None
    queue = any_broker.queue(EMAILS)
    assert not any_broker.client.exists(queue.held, queue.buckets, queue.running, queue.slots)


def test_a_damaged_bucket_counts_as_full(any_broker):
    use(any_broker, limits({PAY: Limit(rate=1, period=3600.0)}))
    any_broker.client.hset(any_broker.queue(EMAILS).buckets, PAY, "not:a number")
    tasks = add(any_broker, PAY, 2)
    assert ids(claim(any_broker)) == tasks[:1]
    assert ids(claim(any_broker)) == []


def test_held_base_is_the_same_in_python_and_lua():
    lib = (Path(__file__).parent.parent / "django_rtq/broker/lua/_lib.lua").read_text()
    assert int(re.search(r"^local HELD_BASE = (\d+)$", lib, re.M)[1]) == HELD_BASE
    assert re.search(r"^local HELD_BASE_TEXT = '(\d+)'$", lib, re.M)[1] == str(HELD_BASE)
    # any pending score (priority band, then sequence) stays below it, and exact when added to it
    assert HELD_BASE > (100 + 100) * 10**13 + 10**13 and 2 * HELD_BASE < 2**53


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"rate_limit": "20/s"}, Limit(rate=20, period=1.0)),
        ({"rate_limit": "100 / m", "burst": 10}, Limit(rate=100, period=60.0, burst=10)),
        ({"rate_limit": "5/h", "max_concurrency": 2}, Limit(rate=5, period=3600.0, max_concurrency=2)),
        ({"max_concurrency": 3}, Limit(max_concurrency=3)),
        ({}, None),
    ],
)
def test_limits_are_written_as_people_say_them(options, expected):
    assert make_limit(**options, where="here") == expected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate_limit": "20"}, "rate_limit must be a string like '20/s'"),
        ({"rate_limit": "0/s"}, "rate_limit must be"),
        ({"rate_limit": 20}, "rate_limit must be"),
        ({"rate_limit": "3/d"}, "rate_limit must be"),
        ({"burst": 5}, "burst needs a rate_limit"),
        ({"rate_limit": "1/s", "burst": 0}, "burst must be a positive whole number"),
        ({"max_concurrency": 0}, "max_concurrency must be a positive whole number"),
        ({"max_concurrency": True}, "max_concurrency must be"),
        ({"max_concurrency": 2.5}, "max_concurrency must be"),
    ],
)
def test_wrong_limits_are_refused_with_where_and_why(options, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        make_limit(**options, where="Task 'shop.tasks.pay'")
    assert str(caught.value).startswith("Task 'shop.tasks.pay': ")


def test_a_limit_describes_itself():
    assert Limit(rate=20, period=1.0, burst=40, max_concurrency=3).describe() == (
        "20/s (burst 40), at most 3 running"
    )
    assert Limit(rate=100, period=60.0).rate_limit == "100/m"
    assert (
        FlowLimits(types={PAY: Limit(max_concurrency=1)}, queues={}).spec("x")
        == '{"shop.tasks.pay": {"c": 1}}'
    )
    assert FlowLimits(types={}, queues={}).spec("x") == ""


@pytest.mark.parametrize("name", ["held", "buckets", "running", "slots"])
def test_a_wrong_typed_flow_key_stops_the_claim_before_it_changes_anything(any_broker, name):
    use(any_broker, limits({PAY: Limit(rate=5, period=1.0, max_concurrency=2)}))
    tasks = add(any_broker, PAY, 3)
    key = getattr(any_broker.queue(EMAILS), name)
    any_broker.client.set(key, "garbage")
    with pytest.raises(
        redis.ResponseError, match=f"WRONGTYPE the flow-control key {re.escape(key)} holds a string"
    ):
        claim(any_broker)
    assert any_broker.client.zrange(any_broker.queue(EMAILS).pending, 0, -1) == tasks
    any_broker.client.delete(key)  # repaired: the queue works again
    assert ids(claim(any_broker)) == tasks[:1]


def test_garbage_in_the_slot_keys_never_stops_a_task_from_settling(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=2)}))
    first, second = add(any_broker, PAY, 2)
    assert ids(claim(any_broker)) == [first, second]
    queue = any_broker.queue(EMAILS)
    any_broker.client.hset(queue.running, PAY, "many")
    assert any_broker.complete(EMAILS, [done(first)], worker_id=WORKER) == 1
    any_broker.client.delete(queue.slots)
    any_broker.client.set(queue.slots, "garbage")
    assert any_broker.fail(EMAILS, second, worker_id=WORKER, run="1", to=TaskState.ARCHIVED, info={})
    assert any_broker.client.zcard(queue.active) == 0


def test_a_claim_that_cannot_start_a_limited_task_for_want_of_a_thread_says_so(any_broker):
    use(any_broker, limits({PAY: Limit(rate=100, period=1.0, burst=10)}))
    tasks = add(any_broker, PAY, 5)
    claimed = claim(any_broker, limit=8, start_now=2)
    assert ids(claimed) == tasks[:2] and claimed.thread_bound
    assert claimed.wait is None  # tokens are there: only a thread is missing
    claimed = claim(any_broker, limit=8, start_now=0)
    assert ids(claimed) == [] and claimed.thread_bound
    claimed = claim(any_broker, limit=8, start_now=8)
    assert ids(claimed) == tasks[2:] and not claimed.thread_bound


def test_a_queue_limit_leaves_tasks_for_free_threads_and_says_so(any_broker):
    use(any_broker, limits(queue=Limit(max_concurrency=5)))
    tasks = add(any_broker, MAIL, 4)
    claimed = claim(any_broker, limit=8, start_now=3)
    assert ids(claimed) == tasks[:3] and claimed.thread_bound
    claimed = claim(any_broker, limit=8, start_now=3)
    assert ids(claimed) == tasks[3:] and not claimed.thread_bound  # none left


def test_a_long_run_of_held_tasks_is_set_aside_over_several_claims_without_waiting(any_broker):
    use(any_broker, limits({PAY: Limit(rate=1, period=3600.0)}))
    pay = add(any_broker, PAY, 450)
    mail = add(any_broker, MAIL)
    first = claim(any_broker, limit=10)
    assert ids(first) == pay[:1] and first.wait == 0  # stopped short: claim again at once
    while not (claimed := claim(any_broker, limit=10)):
        assert claimed.wait == 0
    assert ids(claimed) == mail
    assert held_count(any_broker, PAY) == 449


def test_a_late_claim_keeps_a_little_of_the_rates_accrual(any_broker, clock):
    use(any_broker, limits({PAY: Limit(rate=100, period=1.0)}))  # one start every 10 ms
    tasks = add(any_broker, PAY, 3)
    assert ids(claim(any_broker)) == tasks[:1]
    clock.advance(0.015)  # 5 ms late: 2 ms of it are kept
    claimed = claim(any_broker)
    assert ids(claimed) == tasks[1:2]
    assert claimed.wait == pytest.approx(0.008, abs=0.0011)
    assert ids(claim(any_broker)) == []  # never more than the bucket's one start at once


@pytest.mark.parametrize(
    "bucket", ["-1e300:0", "inf:0", "5:abc", "0.5", "1e308:1700000000000", "99:1700000000000"]
)
def test_garbage_in_a_bucket_reads_as_a_full_bucket(any_broker, bucket):
    use(any_broker, limits({PAY: Limit(rate=1, period=3600.0)}))
    any_broker.client.hset(any_broker.queue(EMAILS).buckets, PAY, bucket)
    tasks = add(any_broker, PAY, 2)
    assert ids(claim(any_broker)) == tasks[:1]
    assert ids(claim(any_broker)) == []


def test_a_bucket_stamped_in_the_future_refills_from_now(any_broker, clock):
    use(any_broker, limits({PAY: Limit(rate=1, period=1.0)}))
    future = clock.ms(60)  # the server's clock stepped back a minute
    any_broker.client.hset(any_broker.queue(EMAILS).buckets, PAY, f"0:{future}")
    tasks = add(any_broker, PAY, 2)
    assert ids(claim(any_broker)) == []
    clock.advance(1)
    assert ids(claim(any_broker)) == tasks[:1]


def test_garbage_in_the_running_count_or_the_held_index_does_not_stop_the_queue(any_broker):
    use(any_broker, limits({PAY: Limit(max_concurrency=1)}))
    queue = any_broker.queue(EMAILS)
    any_broker.client.hset(queue.running, PAY, "inf")
    any_broker.client.zadd(queue.held, {"no separator": 0, f"{PAY}\0notascore\0x": 0})
    pay = add(any_broker, PAY, 2)
    mail = add(any_broker, MAIL)
    assert ids(claim(any_broker)) == [pay[0], *mail]
    assert any_broker.client.hget(queue.running, PAY) == "1"  # rewritten as a count
    assert any_broker.client.zrange(queue.held, 0, -1) == [held_entry(any_broker, pay[1])]


def held_entry(broker: Broker, task_id: str) -> str:
    score = int(broker.client.zscore(broker.queue(EMAILS).pending, task_id)) - HELD_BASE
    return f"{PAY}\0{score:017d}\0{task_id}"

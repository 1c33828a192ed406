"""Tasks enqueued one by one run by priority then in order; a wake-up only when pending was
empty; a hand-off to each idle worker; process_at on the server's clock."""

from __future__ import annotations

import pytest

from django_rtq.broker import Broker, TaskState
from django_rtq.exceptions import TaskIdConflict
from tests.support.factories import EMAILS, WORKER, claim_ids, message
from tests.support.reading import ids_in, next_message, state_of, subscribed


def test_tasks_enqueued_one_by_one_run_by_priority_then_in_enqueue_order(any_broker: Broker):
    tasks = [message(EMAILS, priority=p) for p in (0, 5, -3, 5, 0, 100, -100, -3)]
    for task in tasks[:4]:
        any_broker.enqueue([task])
    any_broker.enqueue(tasks[4:6])
    for task in tasks[6:]:
        any_broker.enqueue([task])

    run_order = sorted(tasks, key=lambda task: -task.priority)  # stable: FIFO within a priority
    assert claim_ids(any_broker, EMAILS) == [task.id for task in run_order]


def test_a_task_given_back_goes_to_the_front_of_its_own_priority(any_broker: Broker):
    high, other_high, low = message(EMAILS, priority=7), message(EMAILS, priority=7), message(EMAILS)
    for task in (high, other_high, low):
        any_broker.enqueue([task])
    assert claim_ids(any_broker, EMAILS, limit=1) == [high.id]

    assert any_broker.requeue(EMAILS, [high.id], worker_id=WORKER) == 1

    assert claim_ids(any_broker, EMAILS) == [high.id, other_high.id, low.id]


def wake_ups(broker: Broker, enqueue) -> int:
    """How many times `enqueue()` publishes on EMAILS's wake channel (told by a message of ours
    published after it: messages of one channel arrive in order)."""
    channel = broker.queue(EMAILS).wake_channel
    with subscribed(broker, channel) as pubsub:
        enqueue()
        broker.client.publish(channel, "end")
        count = 0
        while next_message(pubsub)["data"] != "end":
            count += 1
    return count


def test_a_wake_up_only_when_pending_goes_from_empty_to_not(broker: Broker):
    later = broker.server_now_ms() / 1000 + 3600

    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS, process_at=later)])) == 0
    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS) for _ in range(3)])) == 1
    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS)])) == 0
    claim_ids(broker, EMAILS)
    assert wake_ups(broker, lambda: broker.enqueue([message(EMAILS)])) == 1
    claim_ids(broker, EMAILS)
    taken = ids_in(broker, EMAILS, TaskState.ACTIVE)[0]
    with pytest.raises(TaskIdConflict):
        wake_ups(broker, lambda: broker.enqueue([message(EMAILS, id=taken)]))
    assert ids_in(broker, EMAILS, TaskState.PENDING) == []


def test_one_call_hands_a_task_to_each_idle_worker_and_queues_the_rest(broker: Broker):
    qk = broker.queue(EMAILS)
    listeners = []
    try:
        for worker in ("w1", "w2"):
            pubsub = broker.client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(qk.handoff_channel(worker))
            listeners.append(pubsub)
        for worker in ("w1", "w2"):
            assert broker.claim(EMAILS, worker_id=worker, limit=1, idle_for_ms=5_000) == []
        tasks = [message(EMAILS) for _ in range(3)]

        assert wake_ups(broker, lambda: broker.enqueue(tasks)) == 1

        assert {broker.client.hget(qk.owner, task.id) for task in tasks[:2]} == {"w1", "w2"}
        assert [state_of(broker, EMAILS, task.id) for task in tasks] == ["active", "active", "pending"]
        assert ids_in(broker, EMAILS, TaskState.PENDING) == [tasks[2].id]
        assert broker.client.zcard(qk.idle) == 0
    finally:
        for pubsub in listeners:
            pubsub.close()


def test_on_the_servers_clock_a_past_process_at_is_pending_and_a_future_one_scheduled(broker: Broker):
    now = broker.server_now_ms() / 1000
    past, future, plain = (
        message(EMAILS, process_at=now - 60),
        message(EMAILS, process_at=now + 3600),
        message(EMAILS),
    )
    for task in (past, future, plain):
        broker.enqueue([task])

    assert [state_of(broker, EMAILS, t.id) for t in (past, future, plain)] == [
        "pending",
        "scheduled",
        "pending",
    ]
    assert ids_in(broker, EMAILS, TaskState.PENDING) == [past.id, plain.id]

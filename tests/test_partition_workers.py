"""Fair partitions with real `rtq_worker` processes: a partition that comes after a big backlog
runs in turn beside it, and per-partition limits hold across workers while other partitions run
beside them. Handlers record each run's start and end (tests/testapp/tasks.py: run_recorded)."""

from __future__ import annotations

from collections import Counter, defaultdict

from bench.counting import most_at_once
from django_rtq import enqueue_many
from django_rtq.broker.message import TaskMessage
from tests.support.polling import wait_for
from tests.support.recorded_runs import Run, ended, runs_of, start_workers
from tests.testapp import tasks

#: The tests' queue: each test has a key prefix of its own, so no other test's tasks are in it.
QUEUE = "default"
#: The big partition's backlog in the fairness test, and the small partition that comes after it.
BIG, SMALL = 2000, 20


def intervals_by_partition(runs: list[Run], messages: list[TaskMessage]) -> dict[str, list[tuple]]:
    """The runs' (start, end), by the partition of their task."""
    partition_of = {message.id: message.partition for message in messages}
    by_partition = defaultdict(list)
    for run in runs:
        by_partition[partition_of[run.id]].append((run.start, run.end))
    return dict(by_partition)


def slots_in_use(client, broker) -> tuple[dict, int]:
    """The queue's concurrency use by scope (`running`), and the tasks that hold a slot."""
    keys = broker.queue(QUEUE)
    return client.hgetall(keys.running), client.hlen(keys.slots)


def test_a_small_partition_runs_in_turn_beside_a_big_backlog(start_worker, broker, redis_client):
    start_workers(start_worker, 3, "--queues", QUEUE, "--concurrency", "4")
    enqueue_many([tasks.fair_by_customer.prepare("big", "big") for _ in range(BIG)])
    big_key = tasks.report_key("big")
    wait_for(lambda: redis_client.llen(big_key) >= 20, timeout=20, message="the big partition to run")

    small = [tasks.fair_by_customer.prepare("small", "small") for _ in range(SMALL)]
    enqueue_many(small)
    pending = broker.queue(QUEUE).pending
    backlog_then = redis_client.zcard(pending) - SMALL
    assert backlog_then >= BIG * 3 // 4  # the big partition's backlog was pending as the small one came

    runs = wait_for(lambda: ended(redis_client, "small", SMALL), timeout=30, message="the small one's runs")
    backlog_after = redis_client.zcard(pending)
    last_small_end = max(run.end for run in runs)
    assert {run.id for run in runs} == {message.id for message in small}

    # Most of the big backlog was still pending when the small partition's last run ended: it
    # took its turns beside the big one, not after it (in FIFO order, it would wait for all 2,000).
    assert backlog_after >= BIG // 2
    wait_for(lambda: redis_client.llen(big_key) >= 2 * BIG, timeout=45, interval=0.2, message="the drain")
    big_runs = runs_of(redis_client, "big")
    assert len({run.id for run in big_runs}) == BIG == len(big_runs)  # each ran, once
    started_before = sum(1 for run in big_runs if run.start < last_small_end)
    print(f"big backlog {backlog_then} as the small came; {started_before} big runs started before it ended")
    assert started_before <= BIG // 2
    assert max(run.end for run in big_runs) > last_small_end


def test_two_at_once_per_partition_across_three_workers(start_worker, broker, redis_client):
    start_workers(start_worker, 3, "--queues", QUEUE, "--concurrency", "4")
    messages = [
        tasks.two_at_once_per_customer.prepare("two", customer)
        for _ in range(10)
        for customer in ("acme", "globex", "initech")
    ]
    enqueue_many(messages)

    runs = wait_for(lambda: ended(redis_client, "two", 30), timeout=30, message="30 runs to end")
    assert len(runs) == 30
    by_partition = intervals_by_partition(runs, messages)
    assert {partition: most_at_once(runs) for partition, runs in by_partition.items()} == {
        "acme": 2,
        "globex": 2,
        "initech": 2,
    }  # each partition's limit holds, and is reached
    assert most_at_once([(run.start, run.end) for run in runs]) > 2  # the partitions ran beside each other
    assert len({run.pid for run in runs}) > 1  # on more than one worker
    # a run records its end a moment before its worker settles it and frees its slot
    wait_for(lambda: slots_in_use(redis_client, broker) == ({}, 0), timeout=10, message="free slots")


def test_a_named_partition_has_its_own_limit(start_worker, broker, redis_client):
    start_workers(start_worker, 3, "--queues", QUEUE, "--concurrency", "4")
    task = tasks.one_at_once_per_customer_but_premium
    messages = [task.prepare("named", "premium") for _ in range(12)]
    messages += [task.prepare("named", customer) for _ in range(4) for customer in ("acme", "globex")]
    enqueue_many(messages)

    runs = wait_for(lambda: ended(redis_client, "named", 20), timeout=30, message="20 runs to end")
    assert len(runs) == 20
    by_partition = intervals_by_partition(runs, messages)
    assert {partition: most_at_once(runs) for partition, runs in by_partition.items()} == {
        "premium": 4,
        "acme": 1,
        "globex": 1,
    }
    assert most_at_once([(run.start, run.end) for run in runs]) > 4
    wait_for(lambda: slots_in_use(redis_client, broker) == ({}, 0), timeout=10, message="free slots")


def test_a_weighted_partition_takes_three_turns_to_the_others_one(start_worker, broker, redis_client):
    start_workers(start_worker, 3, "--queues", QUEUE, "--concurrency", "4")
    task = tasks.weighted_by_customer
    broker.pause(QUEUE)  # both backlogs pending before the first claim
    messages = [task.prepare("weighted", customer) for _ in range(400) for customer in ("basic", "gold")]
    enqueue_many(messages)
    broker.resume(QUEUE)

    runs = wait_for(lambda: ended(redis_client, "weighted", 800), timeout=40, message="800 runs to end")
    partition_of = {message.id: message.partition for message in messages}
    first = Counter(partition_of[run.id] for run in runs[:300])
    # 3 to 1 while both have a backlog (225 to 75 of the first 300 claimed; the workers' buffers
    # blur the order of the starts a little); the same weight would give 150 to 150.
    print(f"the first 300 starts by partition: {dict(first)}")
    assert first["gold"] >= 2 * first["basic"], first
    assert len({run.id for run in runs}) == 800 == len(runs)

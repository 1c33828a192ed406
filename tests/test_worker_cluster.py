"""The worker on a 3-master Redis Cluster: queues on different nodes, wake-ups and cancellation."""

from __future__ import annotations

from django_rtq.broker import TaskState, manual
from django_rtq.broker.inspect import Inspector
from django_rtq.worker.server import Worker
from tests.support.polling import wait_for
from tests.support.runs import reports
from tests.testapp import tasks

QUEUES = {"emails": 1, "search": 1, "billing": 1}  # one queue per node of the cluster


def test_a_worker_serves_queues_on_every_node(cluster_broker, prefix, redis_client):
    inspector = Inspector(cluster_broker)
    worker = Worker(broker=cluster_broker, queues=QUEUES, concurrency=4)
    worker.start()
    try:
        cluster_broker.enqueue(
            [tasks.record.using(queue=queue).prepare("cluster", queue) for queue in QUEUES for _ in range(5)]
        )
        wait_for(lambda: len(reports(redis_client, "cluster")) == 15)
        flaky = tasks.flaky.using(queue="billing", retention=60).prepare("cluster-flaky", 1)
        cluster_broker.enqueue([flaky])
        done = wait_for(lambda: (t := inspector.get_task(flaky.id)).state == TaskState.COMPLETED and t)
        assert done.retried == 1

        wait_for(worker.subscriber.subscribed.is_set)
        blocked = tasks.block.using(queue="search").prepare("cluster-cancel")
        cluster_broker.enqueue([blocked])
        wait_for(lambda: reports(redis_client, "cluster-cancel:started"))
        assert manual.cancel(cluster_broker, "search", blocked.id, TaskState.ACTIVE) >= 1
        wait_for(lambda: inspector.get_task(blocked.id).state == TaskState.ARCHIVED)
    finally:
        worker.stop()
    assert sorted(reports(redis_client, "cluster")) == sorted([q for q in QUEUES for _ in range(5)])
    assert sum(inspector.queue_stats(queue).processed_today for queue in QUEUES) == 15 + 2 + 1

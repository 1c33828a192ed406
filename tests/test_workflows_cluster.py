"""Workflows on a 3-master Redis Cluster: children in queues on other nodes than their
workflow, so that every step and every result crosses slots through commands."""

from __future__ import annotations

import json
import signal
import uuid

import pytest

from django_rtq.broker import TaskState
from django_rtq.broker.inspect import Inspector
from django_rtq.broker.workflow import child_outcome, take_commands
from django_rtq.worker.server import Worker
from django_rtq.workflows import apply_due, chain, chord, group, iterator, map_reduce
from django_rtq.workflows.commands import apply_command
from tests.support.polling import wait_for
from tests.testapp import tasks
from tests.testapp.wf_tasks import add, chunk_sum, explode, mul, numbers, split, total

# One queue per node of the cluster, and "default" for the steps that name no queue.
QUEUES = {"emails": 1, "search": 1, "billing": 1, "default": 1}
KEEP = 60


@pytest.fixture
def cluster_worker(cluster_broker):
    worker = Worker(broker=cluster_broker, queues=QUEUES, concurrency=4)
    worker.start()
    yield worker
    worker.stop()


def finished(broker, workflow_id, timeout=30.0):
    inspector = Inspector(broker)
    return wait_for(
        lambda: (task := inspector.get_task(workflow_id)).state != TaskState.WAITING and task,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda: chain(
                add.s(2, 3).using(queue="search"), mul.s(10).using(queue="billing"), queue="emails"
            ),
            50,
        ),
        (
            lambda: group(
                add.s(1, 1).using(queue="search"), add.s(2, 2).using(queue="billing"), queue="emails"
            ),
            [2, 4],
        ),
        (
            lambda: chord(
                [add.s(i, i).using(queue=q) for i, q in enumerate(["emails", "search", "billing"])],
                total.s(),
                queue="billing",
            ),
            6,
        ),
        (
            lambda: group(
                chain(add.s(1, 2).using(queue="search"), mul.s(3).using(queue="emails"), queue="billing"),
                chain(group(add.s(1, 1), add.s(2, 2), queue="search"), total.s(), queue="emails"),
                queue="billing",
            ),
            [9, 6],
        ),
        (
            lambda: map_reduce(
                split.s(60, 7).using(queue="emails"),
                chunk_sum.s().using(queue="search"),
                total.s().using(queue="billing"),
                queue="billing",
            ),
            sum(range(60)),
        ),
    ],
    ids=["chain", "group", "chord", "nesting", "map_reduce"],
)
def test_workflows_cross_nodes(cluster_broker, cluster_worker, make, expected):
    workflow = make()
    workflow.retention = KEEP
    workflow_id = workflow.enqueue(broker=cluster_broker)
    done = finished(cluster_broker, workflow_id)
    assert done.state == TaskState.COMPLETED
    assert done.result == expected


def test_an_iterator_on_the_cluster(cluster_broker, cluster_worker, redis_client):
    name = f"cluster-it-{uuid.uuid4().hex}"  # the report list is on the standalone Redis
    state = {"next": 0, "limit": 25, "name": name}
    workflow_id = iterator(numbers, state, window=6, queue="search", retention=KEEP).enqueue(
        broker=cluster_broker
    )
    assert finished(cluster_broker, workflow_id).result == 25
    assert len(redis_client.lrange(tasks.report_key(f"iterated:{name}"), 0, -1)) == 25


def test_a_failure_crosses_nodes_to_its_workflow(cluster_broker, cluster_worker):
    workflow = chain(
        add.s(1, 1).using(queue="search"), explode.s().using(queue="billing"), queue="emails", retention=KEEP
    )
    done = finished(cluster_broker, workflow.enqueue(broker=cluster_broker))
    assert done.state == TaskState.ARCHIVED


def test_commands_applied_twice_count_once_on_the_cluster(cluster_broker):
    workflow_id = chain(
        add.s(1, 1).using(queue="search"), add.s(1).using(queue="billing"), queue="emails", retention=KEEP
    ).enqueue(broker=cluster_broker)
    outcome = {"cmd_id": "child:a", "position": 0, "ok": True, "payload_json": "2"}
    assert child_outcome(cluster_broker, "emails", workflow_id, **outcome) == "recorded"
    assert child_outcome(cluster_broker, "emails", workflow_id, **outcome) == "dup"
    [(cmd_id, body)] = take_commands(cluster_broker, "emails")
    for _ in range(2):
        apply_command(cluster_broker, cmd_id, json.loads(body))
    assert Inspector(cluster_broker).count("billing", TaskState.PENDING) == 1


def test_a_command_left_by_a_dead_commander_is_applied_on_the_cluster(cluster_broker):
    workflow_id = chain(
        add.s(1, 1).using(queue="search"), add.s(1).using(queue="billing"), queue="emails", retention=KEEP
    ).enqueue(broker=cluster_broker)
    child_outcome(cluster_broker, "emails", workflow_id, cmd_id="c0", position=0, ok=True, payload_json="2")
    assert take_commands(cluster_broker, "emails", lease_ms=50)  # taken; then its commander died
    wait_for(lambda: apply_due(cluster_broker, ["emails"]) == 1, timeout=5)
    assert Inspector(cluster_broker).get_task(f"{workflow_id}.1").message.args == [2, 1]


def test_a_workflow_survives_a_sigkilled_worker_on_the_cluster(redis_cluster, cluster_broker, start_worker):
    env = {
        "RTQ_REDIS_URL": f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}/0",
        "RTQ_TEST_PREFIX": cluster_broker.keys.prefix,
    }
    workflow = map_reduce(
        split.s(300, 3).using(queue="emails"), chunk_sum.s().using(queue="search"),
        total.s().using(queue="billing"), queue="billing", retention=KEEP,
    )  # fmt: skip
    workflow_id = workflow.enqueue(broker=cluster_broker)
    inspector = Inspector(cluster_broker)
    queues = ("--queues", "emails,search,billing", "--concurrency", "2")
    first = start_worker(*queues, lease=1, **env)
    wait_for(lambda: inspector.get_task(workflow_id).workflow.get("stage") == "aggregating", timeout=30)
    first.send_signal(signal.SIGKILL)
    first.wait()
    start_worker(*queues, lease=1, **env)
    done = finished(cluster_broker, workflow_id, timeout=60)
    assert done.state == TaskState.COMPLETED
    assert done.result == sum(range(300))

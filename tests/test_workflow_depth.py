"""Workflows nested deep on a real Redis: ids that stay within a task id's 255 characters, a
depth limit checked at enqueue (WorkflowTooDeep, nothing written), never a RecursionError."""

from __future__ import annotations

import pytest

from django_rtq.broker import TaskState, manual
from django_rtq.broker.workflow import child_id
from django_rtq.exceptions import InvalidTask, WorkflowTooDeep
from django_rtq.workflows import apply_due, chain, chord, group, iterator
from django_rtq.workflows.canvas import MAX_DEPTH
from tests.support.polling import wait_for
from tests.testapp import tasks
from tests.testapp.tasks import add  # kept 60 s once completed: their ids can be read after
from tests.testapp.wf_tasks import explode, mark, nests, total

QUEUES = {"default": 1}
KEEP = 60


def finished(inspector, workflow_id, timeout=60.0):
    return wait_for(
        lambda: (task := inspector.get_task(workflow_id)).state != TaskState.WAITING and task,
        timeout=timeout,
        message=f"workflow {workflow_id} to finish",
    )


def deep_chain(depth: int) -> chain:
    """Chains nested `depth` deep, each adding 1 to its input in each of 10 steps, then running
    the next chain (at position 10: each level's ids would grow by 3 characters)."""
    workflow = chain(add.s(1))
    for _ in range(depth - 1):
        workflow = chain(*[add.s(1)] * 10, workflow)
    return workflow


def deep_groups(depth: int) -> group:
    workflow = group(add.s(1, 1))
    for _ in range(depth - 1):
        workflow = group(add.s(1, 1), workflow)
    return workflow


def deep_chords(chords: int) -> chain:
    """Chords nested in one another, `chords` of them (each is 2 levels: a chain of a group,
    then its callback); the result is `chords` + 1."""
    workflow = chord([add.s(1, 1)], total.s())
    for _ in range(chords - 1):
        workflow = chord([add.s(1, 0), workflow], total.s())
    return workflow


def keys_of(redis_client, prefix: str) -> list[str]:
    return list(redis_client.scan_iter(f"{prefix}:*", count=1000))


def test_a_chain_nested_at_the_limit_runs_to_completion_with_ids_of_255_characters_at_most(
    inspector, run_worker, redis_client, broker
):
    workflow = chain(add.s(0, 0), deep_chain(MAX_DEPTH - 1), add.s(1000), retention=KEEP)
    workflow_id = workflow.enqueue()  # 32 characters; 2 + 3 a level: 331 at the bottom
    with run_worker(queues=QUEUES):
        done = finished(inspector, workflow_id)
    assert (done.state, done.last_error) == (TaskState.COMPLETED, None)
    assert done.result == 10 * (MAX_DEPTH - 2) + 1 + 1000  # every step of every level ran
    ids = redis_client.hkeys(broker.queue("default").state)
    tasks = [task_id for task_id in ids if inspector.get_task(task_id).message.task == add.name]
    assert len(tasks) == 1 + 10 * (MAX_DEPTH - 2) + 1 + 1  # each step once
    assert max(len(task_id) for task_id in ids) <= 255
    assert any("~" in task_id for task_id in ids)  # the deepest ids were shortened


def test_chords_nested_at_the_limit_run_to_completion(inspector, run_worker):
    workflow = deep_chords(MAX_DEPTH // 2)
    workflow.retention = KEEP
    workflow_id = workflow.enqueue(workflow_id="chords-" + "n" * 200)
    with run_worker(queues=QUEUES):
        done = finished(inspector, workflow_id)
    assert (done.state, done.result) == (TaskState.COMPLETED, MAX_DEPTH // 2 + 1)


@pytest.mark.parametrize("make", [deep_chain, deep_groups], ids=["chain", "group"])
def test_one_level_past_the_limit_is_refused_at_enqueue_and_nothing_is_written(
    make, broker, redis_client, prefix
):
    with pytest.raises(WorkflowTooDeep) as refused:
        make(MAX_DEPTH + 1).enqueue()
    assert isinstance(refused.value, ValueError)
    assert (refused.value.depth, refused.value.limit) == (MAX_DEPTH + 1, MAX_DEPTH)
    assert f"{MAX_DEPTH + 1} deep" in str(refused.value)
    assert f"at most {MAX_DEPTH} levels" in str(refused.value)
    assert keys_of(redis_client, prefix) == []


@pytest.mark.parametrize("depth", [1_000, 10_000])
@pytest.mark.parametrize("make", [deep_chain, deep_groups, deep_chords], ids=["chain", "group", "chord"])
def test_workflows_thousands_deep_get_the_clear_error_never_a_recursion_error(
    make, depth, broker, redis_client, prefix
):
    workflow = make(depth)
    with pytest.raises(WorkflowTooDeep, match=r"\d+ deep; at most") as refused:
        workflow.enqueue()
    assert refused.value.depth >= depth
    assert keys_of(redis_client, prefix) == []


def test_a_workflow_that_contains_itself_is_refused_not_looped_over(broker, redis_client, prefix):
    inner = chain(add.s(1, 1))
    outer = group(add.s(1, 1), inner)
    inner.steps = (*inner.steps, outer)  # changed after it was made: a cycle
    with pytest.raises(WorkflowTooDeep, match="contains itself"):
        outer.enqueue()
    assert keys_of(redis_client, prefix) == []


def test_a_sub_workflow_shared_by_many_steps_is_measured_once_per_level():
    shared = group(*[add.s(i, 1) for i in range(3)])
    for _ in range(MAX_DEPTH):
        shared = chain(shared, shared)
    # 2**100 paths: measured by walking them, the check before each enqueue would never end.
    with pytest.raises(WorkflowTooDeep, match=f"{MAX_DEPTH + 1} deep"):
        shared.node()


def test_children_with_shortened_ids_are_cancelled_with_their_workflow(inspector, broker):
    root = "r" * 250  # its grandchildren's ids would have 256 characters and more
    workflow = group(group(group(*[mark.s("never", i) for i in range(3)])))
    assert workflow.enqueue(workflow_id=root) == root
    innermost = inspector.get_task(child_id(child_id(root, 0), 0))
    assert innermost.state == TaskState.WAITING
    children = [child_id(innermost.id, i) for i in range(3)]
    assert sorted(innermost.children) == sorted(children)
    assert all(len(c) <= 255 and "~" in c for c in children)
    assert [inspector.get_task(c).state for c in children] == [TaskState.PENDING] * 3
    # The cancel command's ids are derived in Lua: they must be the ones Python gave them.
    assert manual.cancel(broker, "default", root, TaskState.WAITING) == 1
    apply_due(broker, ["default"])
    assert inspector.get_task(innermost.id).state == TaskState.ARCHIVED
    assert [inspector.get_task(c).state for c in children] == [TaskState.ARCHIVED] * 3


def test_a_child_failing_under_a_shortened_id_names_it(inspector, run_worker):
    root = "f" * 252
    workflow_id = group(group(explode.s()), retention=KEEP).enqueue(workflow_id=root)
    nested = child_id(root, 0)
    with run_worker(queues=QUEUES):
        done = finished(inspector, workflow_id)
    assert done.state == TaskState.ARCHIVED
    shortened = child_id(nested, 0)
    assert "~" in shortened
    assert done.last_error == f"child {nested} failed: child {shortened} failed: exploded on None"


@pytest.mark.parametrize("workflow_id", ["x" * 256, "has space", "a/b"])
def test_a_workflow_id_that_is_no_task_id_is_refused_at_enqueue(workflow_id, broker, redis_client, prefix):
    with pytest.raises(InvalidTask, match="workflow_id must be 1 to 255"):
        group(add.s(1, 1)).enqueue(workflow_id=workflow_id)
    assert keys_of(redis_client, prefix) == []


def test_an_iterator_child_is_held_to_the_limit_on_its_own(inspector, run_worker, redis_client):
    # Made at run time under the iterator: its ids nest one level deeper than the limit.
    allowed = iterator(nests, {"depth": MAX_DEPTH}, retention=KEEP).enqueue(workflow_id="i" * 200)
    refused = iterator(nests, {"depth": MAX_DEPTH + 1}, retention=KEEP).enqueue()
    with run_worker(queues=QUEUES):
        done, failed = finished(inspector, allowed), finished(inspector, refused)
    assert (done.state, done.result) == (TaskState.COMPLETED, 1)
    assert failed.state == TaskState.ARCHIVED
    assert f"nests workflows {MAX_DEPTH + 1} deep; at most {MAX_DEPTH} levels" in failed.last_error
    calls = redis_client.lrange(tasks.report_key("nests:calls"), 0, -1)
    assert calls.count(str(MAX_DEPTH + 1)) == 1  # refused for good, not retried

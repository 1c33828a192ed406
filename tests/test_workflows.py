"""Workflows on a real Redis: chain, group, chord, nesting, map/reduce, iterator, progress,
failure and cancellation, commands applied twice, and a worker SIGKILLed mid-workflow."""

from __future__ import annotations

import json
import logging
import re
import signal
import time
from datetime import timedelta

import pytest

from django_rtq.broker import TaskState, bulk, manual
from django_rtq.broker.scripts import LUA_DIR
from django_rtq.broker.states import Action
from django_rtq.broker.workflow import WORKFLOW_TASKS, child_outcome, defer_command, take_commands
from django_rtq.connection import queue_time
from django_rtq.exceptions import BrokerUnavailable, CorruptWorkflow, InvalidStateTransition, InvalidTask
from django_rtq.operations import Operations
from django_rtq.worker.commander import MAX_COMMAND_ATTEMPTS, Commander, CommandRetries
from django_rtq.workflows import apply_due, chain, chord, group, iterator, map_reduce
from django_rtq.workflows import commands as commands_module
from django_rtq.workflows.commands import apply_command
from tests.support.polling import wait_for
from tests.testapp import tasks
from tests.testapp.wf_tasks import (
    add,
    chunk_sum,
    explode,
    freezes_once,
    mark,
    mul,
    numbers,
    split,
    square_low,
    total,
)

QUEUES = {"default": 1, "low": 1}
KEEP = 60  # seconds a finished workflow is kept, so that its result can be read


def finished(inspector, workflow_id, timeout=20.0):
    """Wait until the workflow has left `waiting`; return it."""
    return wait_for(
        lambda: (task := inspector.get_task(workflow_id)).state != TaskState.WAITING and task,
        timeout=timeout,
        message=f"workflow {workflow_id} to finish",
    )


def run(inspector, run_worker, workflow, timeout=20.0):
    workflow_id = workflow.enqueue()
    with run_worker(queues=QUEUES):
        return finished(inspector, workflow_id, timeout)


def test_a_chain_passes_each_result_to_the_next_step(inspector, run_worker):
    done = run(inspector, run_worker, chain(add.s(2, 3), mul.s(10), add.s(1), retention=KEEP))
    assert done.state == TaskState.COMPLETED
    assert done.result == 51


def test_an_immutable_step_ignores_the_previous_result(inspector, run_worker):
    done = run(inspector, run_worker, chain(add.s(2, 3), mul.si(4, 5), retention=KEEP))
    assert done.result == 20


def test_a_group_returns_its_children_results_in_order(inspector, run_worker):
    done = run(inspector, run_worker, group([add.s(i, i) for i in range(12)], retention=KEEP))
    assert done.result == [2 * i for i in range(12)]


def test_a_chord_calls_back_with_the_group_results(inspector, run_worker):
    done = run(inspector, run_worker, chord([add.s(i, 1) for i in range(5)], total.s(), retention=KEEP))
    assert done.result == sum(i + 1 for i in range(5))


def test_a_group_of_chains_and_a_chain_of_groups_across_queues(inspector, run_worker):
    nested = group(
        chain(add.s(1, 2), mul.s(3)),
        chain(add.s(2, 2), square_low.s()),  # its second step runs in queue "low"
        chain(group(add.s(1, 1), square_low.s(3)), total.s(), mul.s(10)),
        retention=KEEP,
    )
    done = run(inspector, run_worker, nested)
    assert done.result == [9, 16, 110]


def test_a_step_receives_the_input_of_its_workflow(inspector, run_worker):
    # A group inside a chain hands the previous result to each of its children.
    done = run(
        inspector, run_worker, chain(add.s(1, 1), group(mul.s(3), add.s(5)), total.s(), retention=KEEP)
    )
    assert done.result == 2 * 3 + 2 + 5


def test_map_reduce_runs_chunks_with_retries_and_reduces_them(inspector, run_worker):
    workflow = map_reduce(split.s(100, 10), chunk_sum.s(fail_first_attempt_of=30), total.s(), retention=KEEP)
    done = run(inspector, run_worker, workflow)
    assert done.state == TaskState.COMPLETED
    assert done.result == sum(range(100))


def test_map_reduce_stages_and_progress_are_visible(inspector, run_worker):
    workflow_id = map_reduce(split.s(40, 10), chunk_sum.s(), total.s(), retention=KEEP).enqueue()
    waiting = inspector.get_task(workflow_id)
    assert waiting.state == TaskState.WAITING
    assert waiting.workflow["kind"] == "chain" and waiting.workflow["stage"] == "mapping"
    assert waiting.progress == {"done": 0, "total": 3}
    assert waiting.message.task == "django_rtq.map_reduce"
    with run_worker(queues=QUEUES):
        finished(inspector, workflow_id)
    assert inspector.get_task(workflow_id).result == sum(range(40))


def test_a_running_task_reports_progress(inspector, broker):
    from django_rtq.broker.workflow import set_progress

    message = mark.enqueue("progress")
    set_progress(broker, "default", message.id, 3, 10)
    assert inspector.get_task(message.id).progress == {"done": 3, "total": 10}


def test_an_iterator_makes_children_lazily_within_its_window(inspector, run_worker, redis_client):
    state = {"next": 0, "limit": 55, "name": "lazy"}
    workflow_id = iterator(numbers, state, window=10, retention=KEEP).enqueue()
    waiting = inspector.get_task(workflow_id)
    assert waiting.workflow["kind"] == "iterator" and waiting.workflow["made"] == 0
    with run_worker(queues=QUEUES):
        done = finished(inspector, workflow_id)
    assert done.result == 55
    made = redis_client.lrange(tasks.report_key("iterated:lazy"), 0, -1)
    assert sorted(map(int, made)) == list(range(55))


def test_a_child_archived_for_good_fails_its_workflow(inspector, run_worker):
    done = run(inspector, run_worker, chain(add.s(1, 1), explode.s(), mul.s(2), retention=KEEP))
    assert done.state == TaskState.ARCHIVED
    assert "exploded on 2" in done.last_error
    assert done.info["failed_child"].endswith(".1")


def test_a_group_can_collect_errors_instead(inspector, run_worker):
    workflow = group(add.s(1, 1), explode.s(7), on_error="collect", retention=KEEP)
    done = run(inspector, run_worker, workflow)
    assert done.state == TaskState.COMPLETED
    assert done.result[0] == 2
    assert "exploded on 7" in done.result[1]["error"]["message"]


def test_a_failed_nested_workflow_fails_its_parent(inspector, run_worker):
    done = run(inspector, run_worker, chain(group(add.s(1, 1), explode.s()), total.s(), retention=KEEP))
    assert done.state == TaskState.ARCHIVED


def test_cancelling_a_workflow_archives_its_children_that_have_not_started(inspector, broker):
    workflow_id = group([mark.s("never", i) for i in range(3)]).enqueue()
    children = [f"{workflow_id}.{i}" for i in range(3)]
    assert [inspector.get_task(c).state for c in children] == [TaskState.PENDING] * 3
    assert manual.cancel(broker, "default", workflow_id, TaskState.WAITING) == 1
    assert inspector.get_task(workflow_id).state == TaskState.ARCHIVED
    apply_due(broker, ["default"])
    assert [inspector.get_task(c).state for c in children] == [TaskState.ARCHIVED] * 3


def test_a_child_outcome_applied_twice_counts_once(inspector, broker):
    workflow_id = group(add.s(1, 1), add.s(2, 2), retention=KEEP).enqueue()
    apply = {"cmd_id": "child:x", "position": 0, "ok": True, "payload_json": "2"}
    assert child_outcome(broker, "default", workflow_id, **apply) == "recorded"
    assert child_outcome(broker, "default", workflow_id, **apply) == "dup"
    # Another command for the same child (say, a rerun) does not count it twice either.
    assert child_outcome(broker, "default", workflow_id, **{**apply, "cmd_id": "child:y"}) == "dup"
    assert inspector.get_task(workflow_id).workflow["done"] == 1
    assert child_outcome(
        broker, "default", workflow_id, cmd_id="child:z", position=1, ok=True, payload_json="4"
    ) == ("finished")
    assert inspector.get_task(workflow_id).result == [2, 4]


def test_an_activation_applied_twice_enqueues_once(inspector, broker):
    workflow_id = chain(add.s(1, 1), add.s(1), retention=KEEP).enqueue()
    child_outcome(broker, "default", workflow_id, cmd_id="c0", position=0, ok=True, payload_json="2")
    [(cmd_id, body)] = take_commands(broker, "default")
    command = json.loads(body)
    apply_command(broker, cmd_id, command)
    apply_command(broker, cmd_id, command)
    assert inspector.count("default", TaskState.PENDING) == 2  # the first step and the second, once


def test_a_workflow_survives_a_sigkilled_worker(start_worker, inspector, broker):
    workflow_id = map_reduce(split.s(200, 5), chunk_sum.s(), total.s(), retention=KEEP).enqueue()
    first = start_worker("--queues", "default,low", "--concurrency", "2", lease=1)
    wait_for(lambda: inspector.get_task(workflow_id).workflow.get("stage") == "aggregating", timeout=30)
    first.send_signal(signal.SIGKILL)
    first.wait()
    start_worker("--queues", "default,low", lease=1)
    done = finished(inspector, workflow_id, timeout=60)
    assert done.state == TaskState.COMPLETED
    assert done.result == sum(range(200))


@pytest.mark.timeout(300)
def test_a_map_reduce_over_10000_chunks_leaves_no_keys_behind(inspector, run_worker, redis_client, broker):
    workflow_id = map_reduce(split.s(10_000, 1), chunk_sum.s(), total.s(), retention=1).enqueue()
    with run_worker(queues=QUEUES, concurrency=20):
        done = finished(inspector, workflow_id, timeout=240)
        assert done.state == TaskState.COMPLETED
        assert done.result == sum(range(10_000))
        # Once its retention ends, the janitor deletes it like any completed task.
        wait_for(lambda: not redis_client.hexists(broker.queue("default").state, workflow_id), timeout=30)
    assert not list(redis_client.scan_iter(match=f"*{workflow_id}*"))
    for queue in QUEUES:
        qk = broker.queue(queue)
        for column in (qk.msg, qk.state, qk.info, qk.result, qk.progress, qk.command, qk.finished):
            assert not any(field.startswith(workflow_id) for field in redis_client.hkeys(column))
        for state in TaskState:
            assert not any(i.startswith(workflow_id) for i in redis_client.zrange(qk.state_set(state), 0, -1))
        assert redis_client.zcard(qk.commands) == 0


def test_a_child_archived_by_hand_fails_its_workflow(inspector, broker):
    workflow_id = group(mark.s("by-hand", 1), mark.s("by-hand", 2), retention=KEEP).enqueue()
    assert manual.archive(broker, "default", [f"{workflow_id}.0"]) == 1
    apply_due(broker, ["default"])
    failed = inspector.get_task(workflow_id)
    assert failed.state == TaskState.ARCHIVED and "archived by hand" in failed.last_error
    assert inspector.get_task(f"{workflow_id}.1").state == TaskState.ARCHIVED  # cancelled with it


def test_deleting_a_waiting_workflow_cancels_it(inspector, broker, redis_client):
    workflow_id = group(mark.s("deleted", 1), mark.s("deleted", 2)).enqueue()
    assert manual.delete(broker, "default", [workflow_id]) == 1
    apply_due(broker, ["default"])
    assert not redis_client.exists(broker.queue("default").workflow(workflow_id))
    assert inspector.count("default", TaskState.ARCHIVED) == 2  # its children, not started


def test_an_iterator_asks_for_more_only_when_half_its_window_is_free(inspector, broker):
    workflow_id = iterator(numbers, {"next": 0, "limit": 100, "name": "window"}, window=4).enqueue()
    driver = inspector.get_task(f"{workflow_id}.d0")
    assert driver.state == TaskState.PENDING and driver.message.kwargs["state"]["next"] == 0
    children = [(child.queue, json.dumps(child.node())) for child in [mark.s("w", i) for i in range(4)]]
    step = {"position": "d0", "ok": True, "payload_json": "null", "iterator_state_json": '{"next": 4}'}
    child_outcome(broker, "default", workflow_id, cmd_id="d0", new_children=children, **step)
    apply_due(broker, ["default"])
    assert inspector.get_task(workflow_id).workflow["made"] == 4
    assert inspector.count("default", TaskState.PENDING) == 5  # the driver's old entry is not settled here
    for position in range(2):
        child_outcome(
            broker,
            "default",
            workflow_id,
            cmd_id=f"c{position}",
            position=position,
            ok=True,
            payload_json="0",
        )
        if position == 0:  # 3 of 4 still running: no new step yet
            assert not take_commands(broker, "default", lease_ms=0)
    apply_due(broker, ["default"])  # 2 of 4 running: the next step starts, with the state it left
    assert inspector.get_task(f"{workflow_id}.d1").message.kwargs["state"] == {"next": 4}


def test_a_command_left_by_a_dead_commander_is_applied_by_another(inspector, broker):
    workflow_id = chain(add.s(1, 1), add.s(1), retention=KEEP).enqueue()
    child_outcome(broker, "default", workflow_id, cmd_id="c0", position=0, ok=True, payload_json="2")
    assert take_commands(broker, "default", lease_ms=50)  # taken, then its commander died
    assert not take_commands(broker, "default")  # leased: no one else takes it yet
    wait_for(lambda: apply_due(broker, ["default"]) == 1, timeout=5)
    assert inspector.get_task(f"{workflow_id}.1").message.args == [2, 1]


def test_a_map_step_returning_no_chunks_reduces_an_empty_list(inspector, run_worker):
    done = run(inspector, run_worker, map_reduce(split.s(0, 10), chunk_sum.s(), total.s(), retention=KEEP))
    assert done.state == TaskState.COMPLETED and done.result == 0


def test_a_map_step_returning_something_else_fails_the_workflow(inspector, run_worker):
    done = run(inspector, run_worker, map_reduce(add.s(1, 2), chunk_sum.s(), total.s(), retention=KEEP))
    assert done.state == TaskState.ARCHIVED and "list of chunks" in done.last_error


def test_a_finished_workflow_leaves_nothing_but_its_dedupe_records(
    inspector, run_worker, redis_client, broker
):
    workflow_id = chain(add.s(1, 1), group(mul.s(2), mul.s(3)), total.s()).enqueue()
    with run_worker(queues=QUEUES):
        wait_for(lambda: not redis_client.hexists(broker.queue("default").state, workflow_id))
    assert not list(redis_client.scan_iter(match=f"*{workflow_id}*"))
    qk = broker.queue("default")
    for column in (qk.msg, qk.state, qk.info, qk.result, qk.progress, qk.command):
        assert not [field for field in redis_client.hkeys(column) if field.startswith(workflow_id)]


def test_a_frozen_chunk_is_stopped_by_its_timeout_and_retried(inspector, run_worker):
    workflow = map_reduce(split.s(50, 10), freezes_once.s(20), total.s(), retention=KEEP)
    workflow_id = workflow.enqueue()
    with run_worker(queues=QUEUES):
        done = finished(inspector, workflow_id)
    assert done.result == sum(range(50))
    frozen = inspector.get_task(f"{workflow_id}.1.2")  # the chunk [20..29], kept for its retention
    assert frozen.state == TaskState.COMPLETED and frozen.retried == 1
    assert frozen.info["errors"][0]["type"].endswith("TaskTimeout")


# Ending a workflow's children and the workflows themselves by hand


def test_a_child_deleted_by_hand_fails_its_workflow(inspector, broker):
    workflow_id = group(mark.s("deleted-child", 1), mark.s("deleted-child", 2), retention=KEEP).enqueue()
    assert manual.delete(broker, "default", [f"{workflow_id}.0"]) == 1
    apply_due(broker, ["default"])
    failed = inspector.get_task(workflow_id)
    assert failed.state == TaskState.ARCHIVED
    assert failed.last_error == f"child {workflow_id}.0 failed: deleted by hand"
    assert failed.info["failed_child"] == f"{workflow_id}.0"
    cancelled = inspector.get_task(f"{workflow_id}.1")  # its other child, not started: cancelled
    assert cancelled.state == TaskState.ARCHIVED
    assert cancelled.last_error == f"its workflow {workflow_id!r} failed or was cancelled"


def test_purging_a_queue_fails_its_waiting_workflows_and_tells_their_parents(inspector, broker, redis_client):
    # A chain in "default" whose first step is a group waiting in "low", with its children in "default".
    inner = group(mark.s("purged", 1), mark.s("purged", 2), queue="low")
    workflow_id = chain(inner, total.s(), queue="default", retention=KEEP).enqueue()
    group_id, children = f"{workflow_id}.0", [f"{workflow_id}.0.0", f"{workflow_id}.0.1"]
    assert inspector.get_task(group_id, "low").state == TaskState.WAITING
    assert [inspector.get_task(c).state for c in children] == [TaskState.PENDING] * 2
    # And a group in "default" whose children wait in "low".
    in_low = [mark.s("purged", n).using(queue="low") for n in (3, 4)]
    other_id = group(*in_low, queue="default").enqueue()

    purge = bulk.start(broker, "low", Action.DELETE, bulk.PURGE_STATES)
    purge = bulk.carry_on(broker, "low", purge.id, budget=10)

    found = dict(zip(purge.states, purge.counts, strict=True))
    assert (found[TaskState.WAITING], found[TaskState.PENDING], purge.total) == (1, 2, 3)
    assert (purge.finished, purge.done) == (True, 3)
    assert inspector.count("low", TaskState.WAITING) == 0
    assert not redis_client.exists(broker.queue("low").workflow(group_id))
    apply_due(broker, ["low", "default"])
    parent = inspector.get_task(workflow_id)
    assert parent.state == TaskState.ARCHIVED
    assert parent.last_error == f"child {group_id} failed: deleted by hand"
    for child in children:  # in another queue: cancelled by the group's cancel command
        task = inspector.get_task(child)
        assert task.state == TaskState.ARCHIVED
        assert task.last_error == f"its workflow {group_id!r} failed or was cancelled"
    other = inspector.get_task(other_id)  # its children, deleted, failed it
    assert other.state == TaskState.ARCHIVED
    assert other.last_error == f"child {other_id}.0 failed: deleted by hand"
    for queue in ("low", "default"):
        assert redis_client.zcard(broker.queue(queue).commands) == 0
    assert not list(redis_client.scan_iter(match=f"*:wf:{workflow_id}*"))


def test_a_finished_workflow_cannot_be_run_again(inspector, broker):
    workflow_id = group(mark.s("run-again", 1)).enqueue()
    assert manual.cancel(broker, "default", workflow_id, TaskState.WAITING) == 1
    apply_due(broker, ["default"])  # its child is archived too
    assert inspector.get_task(workflow_id).state == TaskState.ARCHIVED

    assert manual.run_now(broker, "default", [workflow_id]) == 0
    with pytest.raises(InvalidStateTransition, match="a finished workflow cannot be run again"):
        Operations(broker=broker).act_on_one(Action.RUN, workflow_id)  # what every surface says
    run_all = bulk.start(broker, "default", Action.RUN, [TaskState.ARCHIVED])
    run_all = bulk.carry_on(broker, "default", run_all.id, budget=10)
    assert (run_all.finished, run_all.done, run_all.skipped) == (True, 1, 1)  # its child, not the workflow

    assert inspector.get_task(workflow_id).state == TaskState.ARCHIVED
    assert inspector.get_task(f"{workflow_id}.0").state == TaskState.PENDING


def test_the_lua_helpers_know_every_workflow_task_name():
    lib = (LUA_DIR / "_lib.lua").read_text()
    block = re.search(r"local WORKFLOW_TASKS = \{(.*?)\n\}", lib, re.DOTALL).group(1)
    assert set(re.findall(r"\['([\w.]+)'\] = true", block)) == WORKFLOW_TASKS


# Postponed workflows


def at(broker, monkeypatch, seconds_from_now):
    """Move the broker's clock (which says when commands are due) `seconds_from_now` ahead."""
    monkeypatch.setattr(broker, "clock", lambda: time.time() + seconds_from_now)


def test_a_postponed_map_reduce_waits_in_its_stage_then_maps(inspector, broker, run_worker, monkeypatch):
    workflow = map_reduce(split.s(40, 10), chunk_sum.s(), total.s(), retention=KEEP)
    before = queue_time()  # the clock a delay is reckoned on (Redis's), not the host's
    workflow_id = workflow.using(delay=timedelta(minutes=5)).enqueue()

    postponed = inspector.get_task(workflow_id)
    assert postponed.state == TaskState.WAITING and postponed.workflow["stage"] == "postponed"
    assert "start" not in postponed.workflow  # its first activation, kept until then, is not shown
    assert before + 300 - 0.001 <= postponed.message.process_at <= queue_time() + 300  # to the ms
    assert postponed.workflow["start_at"] == int(postponed.message.process_at * 1000)
    at(broker, monkeypatch, 299)
    assert apply_due(broker, ["default"]) == 0  # not yet: nothing started
    assert inspector.count("default", TaskState.PENDING) == 0

    at(broker, monkeypatch, 301)
    assert apply_due(broker, ["default"]) == 2  # its start, then the map step's activation
    started = inspector.get_task(workflow_id)
    assert started.workflow["stage"] == "mapping"
    assert inspector.get_task(f"{workflow_id}.0").state == TaskState.PENDING  # the map step
    with run_worker(queues=QUEUES):
        done = finished(inspector, workflow_id)
    assert done.state == TaskState.COMPLETED and done.result == sum(range(40))


def test_a_worker_starts_a_postponed_workflow_when_its_time_comes(inspector, run_worker):
    start_at = time.time() + 1.5
    steps = add.s(2, 3).using(retention=KEEP), mul.s(10)
    workflow_id = chain(*steps, retention=KEEP).using(process_at=start_at).enqueue()
    with run_worker(queues=QUEUES):
        assert inspector.get_task(workflow_id).workflow["stage"] == "postponed"
        done = finished(inspector, workflow_id)
    assert done.state == TaskState.COMPLETED and done.result == 50
    assert inspector.get_task(f"{workflow_id}.0").message.enqueued_at >= start_at - 0.001


def test_a_postponed_workflow_cancelled_before_its_time_never_starts(
    inspector, broker, monkeypatch, redis_client
):
    workflow_id = group(mark.s("never", 1), mark.s("never", 2)).using(delay=60).enqueue()
    assert manual.cancel(broker, "default", workflow_id, TaskState.WAITING) == 1
    assert inspector.get_task(workflow_id).state == TaskState.ARCHIVED
    at(broker, monkeypatch, 61)
    apply_due(broker, ["default"])  # its start command, now a no-op; and no cancel command was written
    assert inspector.count("default", TaskState.PENDING) == 0
    assert inspector.get_task(workflow_id).state == TaskState.ARCHIVED
    assert redis_client.zcard(broker.queue("default").commands) == 0


def test_a_nested_workflow_can_be_postponed_too(inspector, broker, monkeypatch):
    workflow_id = chain(add.s(1, 1), group(mul.s(2), mul.s(3)).using(delay=60)).enqueue()
    child_outcome(broker, "default", workflow_id, cmd_id="c0", position=0, ok=True, payload_json="2")
    apply_due(broker, ["default"])
    nested = inspector.get_task(f"{workflow_id}.1")
    assert nested.state == TaskState.WAITING and nested.workflow["stage"] == "postponed"
    assert inspector.count("default", TaskState.PENDING) == 1  # the first step's entry only
    at(broker, monkeypatch, 61)
    apply_due(broker, ["default"])
    assert "stage" not in inspector.get_task(f"{workflow_id}.1").workflow  # a group has no stages
    assert inspector.get_task(f"{workflow_id}.1.0").message.args == [2, 2]


def test_a_workflow_takes_a_delay_or_a_process_at_not_both():
    with pytest.raises(InvalidTask, match="not both"):
        chain(add.s(1, 2)).using(delay=1, process_at=time.time() + 1)
    with pytest.raises(InvalidTask, match="delay"):
        group(add.s(1, 2)).using(delay=-1)
    assert "delay" not in chain(add.s(1, 2)).using(delay=5).using().node()


# Workflows whose own state in Redis is corrupt: archived with the reason, never stuck

CORRUPT = f"{CorruptWorkflow.__module__}.{CorruptWorkflow.__qualname__}"


def test_the_lua_helpers_name_the_corrupt_workflow_error():
    lib = (LUA_DIR / "_lib.lua").read_text()
    assert re.search(r"local CORRUPT_WORKFLOW = '([\w.]+)'", lib).group(1) == CORRUPT


def corrupt_field(redis_client, broker, workflow_id, name, value, queue="default"):
    """Write garbage (None: delete the field) into a waiting workflow's hash."""
    key = broker.queue(queue).workflow(workflow_id)
    assert redis_client.hexists(key, name), f"no field {name!r} in {redis_client.hgetall(key)}"
    if value is None:
        redis_client.hdel(key, name)
    else:
        redis_client.hset(key, name, value)


def make_chain():
    """A chain of two steps; its first step's outcome is to be applied."""
    workflow_id = chain(mark.s("corrupt", 1), mark.s("corrupt", 2), retention=KEEP).enqueue()
    return workflow_id, {"position": 0, "ok": True, "payload_json": "1"}


def make_group():
    """A group of two; its first child's outcome is to be applied (the second is pending)."""
    workflow_id = group(mark.s("corrupt", 1), mark.s("corrupt", 2), retention=KEEP).enqueue()
    return workflow_id, {"position": 0, "ok": True, "payload_json": "1"}


def make_single():
    """A group of one: its child's outcome finishes it."""
    workflow_id = group(mark.s("corrupt", 1), retention=KEEP).enqueue()
    return workflow_id, {"position": 0, "ok": True, "payload_json": "1"}


def make_iterator():
    """An iterator; its first step's outcome (four new children) is to be applied."""
    workflow_id = iterator(numbers, {"next": 0, "limit": 8, "name": "corrupt"}, window=4).enqueue()
    children = [(child.queue, json.dumps(child.node())) for child in [mark.s("it", i) for i in range(4)]]
    step = {"position": "d0", "ok": True, "payload_json": "null", "iterator_state_json": '{"next":4}'}
    return workflow_id, {**step, "new_children": children}


MAKERS = {"chain": make_chain, "group": make_group, "single": make_single, "iterator": make_iterator}

#: (workflow, field, garbage (None: deleted), the error it is archived with, after "corrupt workflow: ")
CORRUPT_FIELDS = [
    ("chain", "kind", None, "field 'kind' is missing"),
    ("group", "kind", "x", "field 'kind' is 'x', not chain, group or iterator"),
    ("chain", "done", "x", "field 'done' is 'x', not a whole number"),
    ("group", "done", b"\xff1", "field 'done' is '\\xff1', not a whole number"),
    ("group", "n", None, "field 'n' is missing"),
    ("group", "n", "1.5", "field 'n' is '1.5', not a whole number above 0"),
    ("chain", "queue", None, "field 'queue' is missing"),
    ("chain", "queue", "x", "field 'queue' is 'x', not its queue 'default'"),
    ("chain", "step:1", "x", "field 'step:1' is 'x', not a JSON node"),
    ("chain", "step:1", "[]", "field 'step:1' is '[]', not a JSON node"),
    ("chain", "step_queue:1", None, "field 'step_queue:1' is missing"),
    ("single", "created", "x", "field 'created' is 'x', not a whole number"),
    ("single", "retention", "-1", "field 'retention' is '-1', not a whole number"),
    ("iterator", "window", "{}", "field 'window' is '{}', not a whole number above 0"),
    ("iterator", "driver", "{", "fields 'driver' and 'state' do not make the JSON node of its next step"),
]


@pytest.mark.parametrize(
    ("kind", "name", "garbage", "error"),
    CORRUPT_FIELDS,
    ids=[f"{kind}-{name}-{garbage!r}" for kind, name, garbage, _ in CORRUPT_FIELDS],
)
def test_a_corrupt_workflow_is_archived_with_the_reason(
    inspector, broker, redis_client, caplog, kind, name, garbage, error
):
    workflow_id, outcome = MAKERS[kind]()
    corrupt_field(redis_client, broker, workflow_id, name, garbage)
    qk = broker.queue("default")

    with caplog.at_level(logging.ERROR, logger="django_rtq"):
        assert child_outcome(broker, "default", workflow_id, cmd_id="child:corrupt", **outcome) == "corrupt"

    archived = inspector.get_task(workflow_id)
    assert archived.state == TaskState.ARCHIVED
    assert archived.info["error_type"] == CORRUPT
    assert archived.last_error == f"corrupt workflow: {error}"
    assert redis_client.zscore(qk.archived, workflow_id) is not None
    assert redis_client.zscore(qk.state_set("waiting"), workflow_id) is None
    assert not redis_client.exists(qk.workflow(workflow_id), qk.workflow_results(workflow_id))
    assert any(workflow_id in r.getMessage() and error in r.getMessage() for r in caplog.records)
    # The command counts as applied: nothing makes it fail again.
    assert redis_client.zscore(qk.applied, "child:corrupt") is not None
    assert child_outcome(broker, "default", workflow_id, cmd_id="child:corrupt", **outcome) == "gone"
    # Nothing was started for it (no activation written), and its unfinished children are cancelled.
    assert not [c for c in redis_client.zrange(qk.commands, 0, -1) if c.startswith("activate:")]
    apply_due(broker, ["default"])
    if kind == "group":
        cancelled = inspector.get_task(f"{workflow_id}.1")
        assert cancelled.state == TaskState.ARCHIVED
        assert cancelled.last_error == f"its workflow {workflow_id!r} failed or was cancelled"
    assert redis_client.zcard(qk.commands) == 0


def test_a_step_spec_that_cannot_be_planned_fails_its_workflow_with_a_warning(
    inspector, broker, redis_client, caplog
):
    workflow_id, outcome = make_chain()
    corrupt_field(redis_client, broker, workflow_id, "step:1", '{"t": "nope"}')  # JSON, but no node
    with caplog.at_level(logging.WARNING, logger="django_rtq"):
        assert child_outcome(broker, "default", workflow_id, cmd_id="child:0", **outcome) == "recorded"
        apply_due(broker, ["default"])
    failed = inspector.get_task(workflow_id)
    assert failed.state == TaskState.ARCHIVED
    assert failed.last_error == f"child {workflow_id}.1 failed: Unknown workflow node type 'nope'."
    assert any(
        r.levelno == logging.WARNING and workflow_id in r.getMessage() and "nope" in r.getMessage()
        for r in caplog.records
    )


def test_a_corrupt_nested_workflow_fails_its_parent(inspector, broker, redis_client):
    workflow_id = chain(group(mark.s("nested", 1)), mark.s("nested", 2), retention=KEEP).enqueue()
    nested = f"{workflow_id}.0"
    corrupt_field(redis_client, broker, nested, "parent_queue", None)  # needed to tell it a success
    outcome = {"position": 0, "ok": True, "payload_json": "1"}
    assert child_outcome(broker, "default", nested, cmd_id="child:nested", **outcome) == "corrupt"
    assert inspector.get_task(nested).last_error == "corrupt workflow: field 'parent_queue' is missing"

    apply_due(broker, ["default"])  # its failure, told from its message, fails the chain

    parent = inspector.get_task(workflow_id)
    assert parent.state == TaskState.ARCHIVED
    assert parent.info["error_type"] == CORRUPT
    assert parent.last_error == f"child {nested} failed: corrupt workflow: field 'parent_queue' is missing"


def test_a_workflow_whose_hash_is_not_a_hash_is_archived(inspector, broker, redis_client):
    workflow_id, outcome = make_group()
    key = broker.queue("default").workflow(workflow_id)
    redis_client.delete(key)
    redis_client.set(key, "garbage")
    assert child_outcome(broker, "default", workflow_id, cmd_id="child:string", **outcome) == "corrupt"
    archived = inspector.get_task(workflow_id)
    assert archived.state == TaskState.ARCHIVED and archived.info["error_type"] == CORRUPT
    assert archived.last_error == f"corrupt workflow: key {key} is a string, not a hash"
    assert not redis_client.exists(key)


@pytest.mark.parametrize(
    ("name", "garbage", "error"),
    [
        ("start", "[1]", "field 'start' is '[1]', not a JSON list of commands"),
        ("start", None, "field 'start' is missing"),
        ("stage", None, "field 'stage' is missing"),
    ],
)
def test_a_corrupt_postponed_workflow_is_archived_when_its_time_comes(
    inspector, broker, redis_client, monkeypatch, name, garbage, error
):
    workflow_id = group(mark.s("late", 1), mark.s("late", 2)).using(delay=60).enqueue()
    corrupt_field(redis_client, broker, workflow_id, name, garbage)
    at(broker, monkeypatch, 61)
    apply_due(broker, ["default"])
    archived = inspector.get_task(workflow_id)
    assert archived.state == TaskState.ARCHIVED and archived.info["error_type"] == CORRUPT
    assert archived.last_error == f"corrupt workflow: {error}"
    assert inspector.count("default", TaskState.PENDING) == 0  # nothing of it started
    assert redis_client.zcard(broker.queue("default").commands) == 0


# The commander's last resort: a command that keeps failing is given up


def bad_activation(redis_client, broker, workflow_id):
    """Write an activation command of this workflow that cannot be applied (its items are no
    list): an error no script foresees. Returns its id and JSON."""
    qk = broker.queue("default")
    cmd_id = f"activate:{workflow_id}:bad:1"
    body = json.dumps({"type": "activate", "parent": workflow_id, "parent_queue": "default", "items": 5})
    redis_client.hset(qk.command, cmd_id, body)
    redis_client.zadd(qk.commands, {cmd_id: 0})
    return cmd_id, body


def test_the_commander_gives_up_a_command_that_keeps_failing(inspector, broker, redis_client, caplog):
    workflow_id = group(mark.s("given-up", 1), mark.s("given-up", 2), retention=KEEP).enqueue()
    cmd_id, body = bad_activation(redis_client, broker, workflow_id)
    commander = Commander(broker=broker, queues=["default"], interval=60)
    commander.retries.delay = 0  # due again at once: tried at each pass
    qk = broker.queue("default")

    with caplog.at_level(logging.ERROR, logger="django_rtq"):
        for _ in range(MAX_COMMAND_ATTEMPTS - 1):
            commander.run_once()
        assert redis_client.hexists(qk.command, cmd_id)
        assert inspector.get_task(workflow_id).state == TaskState.WAITING
        commander.run_once()

    failures = [r for r in caplog.records if r.getMessage().startswith(f"could not apply command {cmd_id!r}")]
    assert len(failures) == MAX_COMMAND_ATTEMPTS
    [given_up] = [r for r in caplog.records if r.getMessage().startswith("giving up command")]
    assert given_up.levelno == logging.ERROR
    assert cmd_id in given_up.getMessage() and body in given_up.getMessage()
    assert not redis_client.hexists(qk.command, cmd_id)
    assert redis_client.zcard(qk.commands) == 0  # the workflow's cancel command applied too
    # Its workflow could never finish without it: archived as corrupt, its children cancelled.
    archived = inspector.get_task(workflow_id)
    assert archived.state == TaskState.ARCHIVED and archived.info["error_type"] == CORRUPT
    assert cmd_id in archived.last_error
    assert [inspector.get_task(f"{workflow_id}.{i}").state for i in range(2)] == [TaskState.ARCHIVED] * 2


def test_a_failed_command_is_tried_again_with_backoff_then_given_up(broker, caplog):
    retries = CommandRetries(broker, logging.getLogger("django_rtq.test"))
    error = ValueError("no")
    body = '{"type": "nothing"}'
    with caplog.at_level(logging.ERROR, logger="django_rtq"):
        delays = [retries.failed("default", "c1", body, error) for _ in range(MAX_COMMAND_ATTEMPTS)]
    assert delays == [1.0, 2.0, 4.0, 8.0, None]
    assert any("giving up command 'c1'" in r.getMessage() for r in caplog.records)
    # Given up, or rewritten meanwhile: counted afresh.
    assert retries.failed("default", "c1", body, error) == 1.0
    assert retries.failed("default", "c1", body + " ", error) == 1.0


def test_a_failed_command_is_due_again_after_its_delay_not_its_lease(inspector, broker, redis_client):
    workflow_id = group(mark.s("delayed", 1)).enqueue()
    cmd_id, _ = bad_activation(redis_client, broker, workflow_id)
    commander = Commander(broker=broker, queues=["default"], interval=60)
    commander.run_once()
    due_in = redis_client.zscore(broker.queue("default").commands, cmd_id) - broker.now_ms()
    assert 0 < due_in <= 1000  # the first delay, one second; a lease would be 30
    assert inspector.get_task(workflow_id).state == TaskState.WAITING


def test_redis_being_unavailable_does_not_count_as_a_failure(inspector, broker, redis_client, monkeypatch):
    workflow_id = group(mark.s("unavailable", 1)).enqueue()
    cmd_id, _ = bad_activation(redis_client, broker, workflow_id)

    def unavailable(*args, **kwargs):
        raise BrokerUnavailable("Redis is unreachable")

    monkeypatch.setattr(commands_module, "apply_command", unavailable)
    commander = Commander(broker=broker, queues=["default"], interval=60)
    commander.retries.delay = 0
    for _ in range(MAX_COMMAND_ATTEMPTS + 1):
        with pytest.raises(BrokerUnavailable):
            commander.run_once()
        defer_command(broker, "default", cmd_id, 0)  # due again at once, not when its lease ends
    assert redis_client.hexists(broker.queue("default").command, cmd_id)
    assert inspector.get_task(workflow_id).state == TaskState.WAITING

"""A queue name with a typo is warned of: a task type's, a configured one, at enqueue, in a worker."""

from __future__ import annotations

import logging

from django_rtq.checks import check_queue_names
from django_rtq.queue_names import named_queues
from tests.support.reading import pending_count
from tests.testapp import tasks as testapp_tasks


def test_a_task_types_queue_that_default_workers_do_not_serve_is_a_warning():
    [found] = [m for m in check_queue_names() if m.obj == "tests.testapp.tasks.record_high"]
    assert (found.id, found.msg) == (
        "django_rtq.W004",
        "Task 'tests.testapp.tasks.record_high' goes to queue 'high', which is not in RTQ['QUEUES']: "
        "workers started without --queues do not serve it.",
    )
    assert not [
        m for m in check_queue_names() if m.obj == "tests.testapp.tasks.record_low"
    ]  # "low" is served


def test_a_configured_queue_nothing_names_is_a_warning(settings):
    settings.RTQ = {**settings.RTQ, "QUEUES": {"default": 1, "low": 1, "critcal": 5}}
    found = [m for m in check_queue_names() if m.id == "django_rtq.W005"]
    assert [m.msg for m in found] == [
        "Queue 'critcal' of RTQ['QUEUES'] is named by no task type, schedule or TASKS backend, nor is "
        "it DEFAULT_QUEUE: is it a typo?"
    ]
    settings.RTQ = {
        **settings.RTQ,
        "PERIODIC": {"x": {"task": "tests.testapp.tasks.record_periodic", "every": 60, "queue": "critcal"}},
    }
    assert not [m for m in check_queue_names() if m.id == "django_rtq.W005"]


def test_an_enqueue_to_a_queue_named_nowhere_is_a_warning_once(broker, caplog):
    with caplog.at_level(logging.WARNING, logger="django_rtq"):
        testapp_tasks.record.using(queue="nope").enqueue("a")
        testapp_tasks.record.using(queue="nope").enqueue("b")
        testapp_tasks.record.using(queue="low").enqueue("c")
    assert [r.getMessage() for r in caplog.records] == [
        "task 'tests.testapp.tasks.record' was enqueued to queue 'nope', which the project names "
        "nowhere (not in RTQ['QUEUES'], nor the queue of a task type, schedule or TASKS backend): only "
        f"a worker started with --queues nope will run it. Known queues: {', '.join(sorted(named_queues()))}."
    ]
    assert pending_count(broker, "nope") == 2  # enqueued all the same: a queue may be made up at run time


def test_a_worker_warns_of_a_queue_named_nowhere_and_never_used(start_worker, broker):
    process = start_worker("--queues", "critcal", "--burst")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert (
        "queue 'critcal' is named nowhere in the project (RTQ['QUEUES'], a task type, a schedule or a "
        "TASKS backend) and nothing was ever enqueued to it: a typo? Known queues: default, high, low."
    ) in output


def test_a_worker_of_a_queue_made_up_at_run_time_does_not_warn(start_worker, broker):
    testapp_tasks.record.using(queue="tenant-7").enqueue("made-up")
    process = start_worker("--queues", "tenant-7", "--burst")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and "typo" not in output, output
    assert pending_count(broker, "tenant-7") == 0

"""The processor's roles driven one step at a time through their seams, on a real Redis: a claim
round fills the job table, the executor runs a job, the settler settles a batch, and the watchdog
lets go of tasks whose lease it could not renew."""

from __future__ import annotations

import time

import pytest

from django_rtq.broker import TaskState
from django_rtq.context import set_current_task
from django_rtq.worker.processor import Processor
from django_rtq.worker.processor.jobs import JobState
from django_rtq.worker.syncer import Syncer
from tests.support.factories import WORKER
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

QUEUE = "default"


@pytest.fixture
def processor(broker):
    """A processor whose threads never start: the test plays each role's part itself."""
    made = Processor(
        broker=broker, worker_id=WORKER, queues={QUEUE: 1}, concurrency=2, syncer=Syncer(interval=1)
    )
    yield made
    made.fetcher.leave_idle()  # and stop listening
    set_current_task(None)  # an executor thread's own, set here by the runs on the test's thread


def taken(processor: Processor) -> list:
    work = processor.jobs.work
    return [work.get_nowait() for _ in range(processor.jobs.queued)]


def test_a_claim_round_fills_the_job_table_and_the_executor_and_settler_finish_its_jobs(processor, inspector):
    ids = [tasks.add.enqueue(i, 1).id for i in range(3)]

    assert processor.fetcher.run_once() is False  # fewer than the room it had: the queue is dry
    assert processor.jobs.queued == 3
    assert {inspector.get_task(task_id).state for task_id in ids} == {TaskState.ACTIVE}

    jobs = taken(processor)
    for job in jobs:
        assert processor.executor.run(job)
        assert job.state is JobState.DONE
    assert processor.jobs.in_flight == 0
    assert processor.settler.run_once() is True  # one batch settled; not told to stop

    finished = [inspector.get_task(task_id) for task_id in ids]
    assert [task.state for task in finished] == [TaskState.COMPLETED] * 3
    assert [task.result for task in finished] == [1, 2, 3]
    assert processor.jobs.owned_by_queue() == {}


def test_the_watchdog_lets_go_of_tasks_whose_lease_it_could_not_renew(processor, inspector):
    ids = [tasks.noop.enqueue().id for _ in range(2)]
    processor.fetcher.run_once()
    assert processor.jobs.queued == 2

    processor.watchdog.run_once()  # renewed just now: nothing to do
    assert processor.jobs.lost == []

    later = time.monotonic() + processor.watchdog.lease_budget + 1
    processor.watchdog.monotonic = lambda: later  # no renewal came for longer than a lease's budget
    processor.watchdog.run_once()

    assert sorted(job.id for job in processor.jobs.lost) == sorted(ids)
    assert {job.state for job in processor.jobs.lost} == {JobState.ABANDONED}
    assert processor.jobs.in_flight == 0
    for job in taken(processor):  # an executor taking an abandoned job skips it
        assert processor.executor.run(job) and job.state is JobState.ABANDONED and job.started_at is None
    assert processor.jobs.queued == 0

    processor.fetcher.run_once()  # gives the lost tasks back, uncounted, then claims them again
    assert processor.jobs.lost == [] and processor.jobs.queued == 2
    again = [inspector.get_task(task_id) for task_id in ids]
    assert {task.state for task in again} == {TaskState.ACTIVE}
    assert [task.attempt.retried for task in again] == [0, 0]

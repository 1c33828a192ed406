"""The processor's roles driven one step at a time through their seams, on a real Redis: a claim
round fills the job table, the executor runs a job, the settler settles a batch, and the watchdog
lets go of tasks whose lease it could not renew, and stops a handler only while it runs."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter

import pytest

from django_rtq import signals
from django_rtq.broker import ClaimedTask, TaskState
from django_rtq.context import set_current_task
from django_rtq.exceptions import TaskTimeout
from django_rtq.worker.processor import Processor
from django_rtq.worker.processor.jobs import Job, JobState, JobTable
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


def test_a_handler_that_returned_is_not_interrupted_and_its_outcome_stands(processor, inspector):
    """The watchdog's stop that comes once the handler returned (here from `task_succeeded`,
    sent on the executor's thread after the handler) is too late: nothing is raised in the
    thread, which may be in the worker's own code, and the result is settled."""
    task_id = tasks.add.enqueue(2, 3).id
    processor.fetcher.run_once()
    [job] = taken(processor)
    answers = []

    def stop_now(sender, **kwargs):
        answers.append(processor.watchdog.interrupt(job, TaskTimeout("the task ran longer than its timeout")))

    signals.task_succeeded.connect(stop_now, weak=False)
    try:
        assert processor.executor.run(job)
    finally:
        signals.task_succeeded.disconnect(stop_now)

    assert answers == [False]
    assert job.state is JobState.DONE
    processor.settler.run_once()
    done = inspector.get_task(task_id)
    assert (done.state, done.result) == (TaskState.COMPLETED, 5)


def test_a_stop_that_comes_before_the_handler_starts_keeps_it_from_running(processor, inspector):
    """Stopped between its claim's start and its handler (here from `task_started`): the handler
    never runs, and the task fails with the stop's error."""
    tasks.add.enqueue(2, 3)
    processor.fetcher.run_once()
    [job] = taken(processor)
    handled = []

    def stop_now(sender, **kwargs):
        handled.append(processor.watchdog.interrupt(job, TaskTimeout("the task ran longer than its timeout")))

    processor.executor.threads.append(threading.current_thread())  # this test runs the job
    signals.task_started.connect(stop_now, weak=False)
    try:
        assert processor.executor.run(job) is False  # its thread was replaced: it ends
    finally:
        signals.task_started.disconnect(stop_now)
        processor.executor.end_threads()  # the thread started in its place

    assert handled == [True]
    assert job.state is JobState.ABANDONED
    outcome = processor.jobs.outcomes.get_nowait()
    assert isinstance(outcome.failure.error, TaskTimeout)
    assert outcome.result_json is None


def spin(seconds: float) -> None:
    """Busy for `seconds`: a handler's work, or the moment a stop comes at (not a wait for anything)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def test_an_interruption_never_lands_after_the_handler():
    """A stop racing the handler's return lands inside the handler (or as it leaves), or not at
    all: never later, in the worker's own code, where it could leave the job table's lock held
    by a thread that ends. 300 races, the stop at a random moment of each."""
    table = JobTable()
    landed: Counter[str] = Counter()

    def run(job: Job, entered: threading.Event) -> None:
        job.thread = threading.current_thread()
        try:
            job.enter_handler()
            try:
                entered.set()
                spin(random.uniform(0, 0.001))
            finally:
                job.leave_handler()
        except TaskTimeout:
            landed["inside"] += 1
            return
        try:
            with table.cond:  # after the handler: the worker's code takes its lock
                spin(0.00001)
        except TaskTimeout:
            landed["after"] += 1
            return
        landed["not at all"] += 1

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.00002)  # threads take turns often: the races fall everywhere
    try:
        for _ in range(300):
            race(run, table)
    finally:
        sys.setswitchinterval(switch_interval)

    assert landed["after"] == 0
    assert landed["inside"] > 0 and landed["not at all"] > 0, landed


def race(run, table: JobTable) -> None:
    """One race: a handler of a random length, stopped at a random moment."""
    job = Job(claimed=ClaimedTask(id="t", queue=QUEUE, raw_message=None), message=None, task_type=None)
    entered = threading.Event()
    thread = threading.Thread(target=run, args=(job, entered))
    thread.start()
    assert entered.wait(5)
    spin(random.uniform(0, 0.001))
    with table.cond:
        job.interrupt_handler(TaskTimeout("the task ran longer than its timeout"))
    thread.join(5)
    assert not thread.is_alive()
    assert table.cond.acquire(timeout=1), "the job table's lock was left held"
    table.cond.release()


def test_a_handlers_return_value_is_kept_as_compact_json():
    from django_rtq.exceptions import NonRetryableError
    from django_rtq.worker.processor.executor import encode_result

    assert encode_result(None) == "null"  # what most handlers return, without the encoder
    assert encode_result({"a": [1, 2.5]}) == '{"a":[1,2.5]}'
    with pytest.raises(NonRetryableError, match="not JSON-serializable"):
        encode_result(float("nan"))

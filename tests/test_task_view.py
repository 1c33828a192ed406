"""One view of a task (task_view.py): a task kept live after it finished and its mirror row say
the same things about it."""

from __future__ import annotations

import pytest

from django_rtq.broker import TaskState
from django_rtq.models import FinishedTask
from django_rtq.task_view import view_of_finished_task, view_of_live_task
from tests.support.polling import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_finished_task_reads_the_same_live_and_from_its_mirror_row(mirroring, run_worker, inspector):
    message = tasks.flaky.using(retention=60, priority=3).enqueue("viewed", failures=1)
    with run_worker():
        wait_for(lambda: inspector.get_task(message.id).state == TaskState.COMPLETED, message="completed")
        wait_for(lambda: FinishedTask.objects.filter(pk=message.id).exists(), message="mirrored")
    live = view_of_live_task(inspector.get_task(message.id))
    finished = view_of_finished_task(FinishedTask.objects.get(pk=message.id))

    assert (live.live, finished.live) == (True, False)
    same = ("id", "queue", "state", "task", "args", "kwargs", "priority", "retried", "errors", "result")
    assert {name: getattr(live, name) for name in same} == {name: getattr(finished, name) for name in same}
    assert live.state == TaskState.COMPLETED and live.retried == 1 and live.result == 2
    assert [error["message"] for error in live.errors] == ["attempt 1 fails"]
    assert (live.worker, live.workers) == (finished.worker, finished.workers)
    assert len(live.workers) == 2
    for name in ("enqueued_at", "started_at", "finished_at", "last_attempted_at"):
        live_at, finished_at = getattr(live, name), getattr(finished, name)
        assert abs((live_at - finished_at).total_seconds()) < 0.001, name

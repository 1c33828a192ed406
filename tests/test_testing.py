"""The testing helpers users' tests use: capturing enqueued tasks, and running them eagerly."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from django_rtq import InvalidTask, NonRetryableError, current_task, enqueue_many, signals, task
from django_rtq.testing import TooManyNestedTasks, capture_tasks, run_eagerly
from tests.testapp import dtasks

try:
    from django.tasks import task as django_task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task as django_task

#: What the tasks below did, in order (they run in this process).
done: list[object] = []


@pytest.fixture(autouse=True)
def forget_what_was_done():
    done.clear()
    yield
    done.clear()


@task(queue="emails")
def send_receipt(order_id, *, copy_to=None):
    context = current_task()
    done.append(("receipt", order_id, copy_to, context.id if context else None))
    return f"receipt {order_id}"


@task
def ship(order_id):
    done.append(("ship", order_id))
    send_receipt.enqueue(order_id)
    return order_id


@task
def echo_arguments(*args, **kwargs):
    done.append((args, kwargs))
    return [list(args), kwargs]


@task
def explode(message):
    raise ValueError(message)


@task
def enqueues_itself(depth):
    done.append(depth)
    enqueues_itself.enqueue(depth + 1)


@task
async def async_double(value):
    context = current_task()
    return {"double": value * 2, "task": context.task if context else None}


@django_task
def django_echo(*args, **kwargs):
    done.append(("django", args, kwargs))
    return [list(args), kwargs]


@task
def returns_a_set():
    return {1, 2}


def checkout(request: HttpRequest, order_id: int) -> HttpResponse:
    """A view as a project would write it: it enqueues a receipt email for the order."""
    send_receipt.using(delay=timedelta(minutes=5)).enqueue(order_id, copy_to="shop@example.com")
    return HttpResponse("thanks")


def pay(request: HttpRequest, order_id: int) -> HttpResponse:
    """The view of docs/testing.md: the receipt is enqueued once the order is saved."""
    send_receipt.enqueue_on_commit(order_id)
    return HttpResponse("paid")


def keys_of(redis_client, prefix: str) -> list[str]:
    return list(redis_client.scan_iter(f"{prefix}:*"))


# Capture


@pytest.mark.django_db(transaction=True)
def test_capture_takes_every_way_of_enqueueing_and_nothing_reaches_redis(prefix, redis_client):
    with capture_tasks() as captured:
        first = send_receipt.enqueue(1)
        send_receipt.using(queue="urgent", priority=5).enqueue(2)
        enqueue_many([echo_arguments.prepare("a"), echo_arguments.prepare("b")])
        with transaction.atomic():
            send_receipt.enqueue_on_commit(3)
            assert len(captured) == 4  # not before the commit
        result = dtasks.multiply.enqueue(6, 7)  # the django.tasks backend

    assert [(m.task, m.args) for m in captured.tasks] == [
        (send_receipt.name, [1]),
        (send_receipt.name, [2]),
        (echo_arguments.name, ["a"]),
        (echo_arguments.name, ["b"]),
        (send_receipt.name, [3]),
        ("tests.testapp.dtasks.multiply", [6, 7]),
    ]
    assert captured.tasks[0] is first
    assert captured.tasks[-1].id == result.id
    assert keys_of(redis_client, prefix) == []
    assert done == []  # captured, not run


def test_a_captured_enqueue_is_validated_and_announced(prefix):
    announced = []

    def receiver(sender, message, **kwargs):
        announced.append((sender, message.args))

    signals.task_enqueued.connect(receiver)
    try:
        with capture_tasks() as captured:
            send_receipt.enqueue(1)
            with pytest.raises(InvalidTask):
                send_receipt.using(priority=1000).enqueue(2)
    finally:
        signals.task_enqueued.disconnect(receiver)
    assert announced == [(send_receipt, [1])]
    assert len(captured) == 1


def test_enqueueing_reaches_redis_again_after_the_capture(prefix, inspector):
    with capture_tasks():
        send_receipt.enqueue(1)
    message = send_receipt.enqueue(2)

    found = inspector.get_task(message.id, "emails")
    assert found.message.args == [2]
    assert inspector.queue_stats("emails").pending == 1


def test_captures_nest_and_the_innermost_takes_the_tasks(prefix):
    with capture_tasks() as outer:
        send_receipt.enqueue(1)
        with capture_tasks() as inner:
            send_receipt.enqueue(2)
        send_receipt.enqueue(3)

    assert [m.args for m in outer] == [[1], [3]]
    assert [m.args for m in inner] == [[2]]


def test_assert_enqueued_checks_the_fields_it_is_given(prefix):
    with capture_tasks() as captured:
        response = checkout(RequestFactory().post("/checkout/"), order_id=42)
        send_receipt.enqueue(43)
    assert response.status_code == 200

    message = captured.assert_enqueued(
        send_receipt,
        args=[42],
        kwargs={"copy_to": "shop@example.com"},
        queue="emails",
        delay=timedelta(minutes=5),
    )
    assert message.args == [42]
    assert message.process_at == pytest.approx(message.enqueued_at + 300)
    captured.assert_enqueued(send_receipt, args=(43,), delay=None, priority=0)
    captured.assert_enqueued(send_receipt.name, queue="emails", count=2)
    captured.assert_enqueued(send_receipt, process_at=message.process_at)
    assert captured.filter(send_receipt, delay=300) == [message]
    assert captured.filter(queue="emails") == captured.tasks
    assert captured.filter(echo_arguments) == []


@pytest.mark.django_db
def test_a_views_receipt_is_captured_at_commit_then_run(prefix, django_capture_on_commit_callbacks):
    with capture_tasks() as captured:
        with django_capture_on_commit_callbacks(execute=True):
            pay(RequestFactory().post("/pay/"), order_id=42)
            captured.assert_not_enqueued()  # the test's transaction has not committed yet
        message = captured.assert_enqueued(send_receipt, args=[42], queue="emails")

        [run] = captured.run_all()

    assert (run.message, run.result) == (message, "receipt 42")
    assert done == [("receipt", 42, None, message.id)]


def test_assert_enqueued_says_what_was_enqueued_instead(prefix):
    with capture_tasks() as captured:
        send_receipt.enqueue(41)
        echo_arguments.enqueue("x")

    with pytest.raises(AssertionError) as failure:
        captured.assert_enqueued(send_receipt, args=[42], queue="emails")
    assert str(failure.value) == (
        f"Expected {send_receipt.name} to be enqueued with args=[42], queue='emails', but it was not.\n"
        f"Enqueued (2):\n"
        f"  - {send_receipt.name}(args=[41], kwargs={{}}) queue='emails'  [differs: args]\n"
        f"  - {echo_arguments.name}(args=['x'], kwargs={{}}) queue='default'"
    )


def test_assert_enqueued_names_the_delay_and_the_count(prefix):
    with capture_tasks() as captured:
        send_receipt.using(delay=60).enqueue(1)

    with pytest.raises(AssertionError) as failure:
        captured.assert_enqueued(send_receipt, delay=30, count=2)
    assert str(failure.value).splitlines() == [
        f"Expected {send_receipt.name} to be enqueued 2 times with delay=30, but it was 0 times.",
        "Enqueued (1):",
        f"  - {send_receipt.name}(args=[1], kwargs={{}}) queue='emails' delay=60.000s  [differs: delay]",
    ]


def test_assert_enqueued_with_a_count_fails_on_more(prefix):
    with capture_tasks() as captured:
        send_receipt.enqueue(1)
        send_receipt.enqueue(2)

    captured.assert_enqueued(send_receipt, count=2)
    with pytest.raises(AssertionError, match=r"to be enqueued once, but it was 2 times\.\nEnqueued \(2\)"):
        captured.assert_enqueued(send_receipt, count=1)


def test_assert_enqueued_on_nothing_says_so(prefix):
    with capture_tasks() as captured:
        pass
    with pytest.raises(AssertionError, match=re.escape("but it was not.\nNothing was enqueued.")):
        captured.assert_enqueued(send_receipt)
    with pytest.raises(ValueError, match="assert_not_enqueued"):
        captured.assert_enqueued(send_receipt, count=0)
    with pytest.raises(TypeError, match="Unknown field"):
        captured.filter(send_receipt, queues="emails")


def test_assert_not_enqueued_lists_the_tasks_that_were(prefix):
    with capture_tasks() as captured:
        send_receipt.enqueue(7)

    captured.assert_not_enqueued(echo_arguments)
    captured.assert_not_enqueued(send_receipt, args=[8])
    with pytest.raises(AssertionError) as failure:
        captured.assert_not_enqueued(send_receipt, args=[7])
    assert str(failure.value) == (
        f"Expected no {send_receipt.name} with args=[7] to be enqueued, but found once:\n"
        f"  - {send_receipt.name}(args=[7], kwargs={{}}) queue='emails'"
    )
    with pytest.raises(AssertionError, match="Expected no task to be enqueued"):
        captured.assert_not_enqueued()
    captured.clear()
    captured.assert_not_enqueued()


def test_a_django_task_is_asserted_by_the_task_itself(prefix):
    with capture_tasks() as captured:
        dtasks.low_priority.enqueue("v")

    captured.assert_enqueued(dtasks.low_priority, args=["v"], queue="low", priority=10)


def test_run_all_runs_captured_tasks_in_order_and_those_they_enqueue(prefix, redis_client):
    with capture_tasks() as captured:
        ship.enqueue(1)
        send_receipt.enqueue(2, copy_to="me")
        runs = captured.run_all()

        assert [(run.message.task, run.result) for run in runs] == [
            (ship.name, 1),
            (send_receipt.name, "receipt 2"),
            (send_receipt.name, "receipt 1"),  # enqueued by ship
        ]
        receipt_ids = [m.id for m in captured.filter(send_receipt)]
        assert done == [
            ("ship", 1),
            ("receipt", 2, "me", receipt_ids[0]),
            ("receipt", 1, None, receipt_ids[1]),
        ]
        assert captured.run_all() == []  # each runs once
        captured.assert_enqueued(send_receipt, args=[1])
    assert keys_of(redis_client, prefix) == []


def test_run_all_stops_tasks_that_keep_enqueueing_tasks(prefix):
    with capture_tasks() as captured:
        enqueues_itself.enqueue(0)
        with pytest.raises(TooManyNestedTasks, match="more than 3 deep"):
            captured.run_all(max_depth=3)
    assert done == [0, 1, 2, 3]


def test_run_all_raises_a_handlers_error_or_returns_it(prefix):
    with capture_tasks() as captured:
        explode.enqueue("first")
        echo_arguments.enqueue(1)
        with pytest.raises(ValueError, match="first"):
            captured.run_all()
        explode.enqueue("second")
        runs = captured.run_all(raise_errors=False)

    assert [(run.succeeded, str(run.error) if run.error else run.result) for run in runs] == [
        (True, [[1], {}]),
        (False, "second"),
    ]


# Eager


def test_eager_runs_the_handler_at_the_enqueue_with_its_context(prefix, redis_client):
    with run_eagerly() as runs:
        message = send_receipt.enqueue(5, copy_to="me")
        assert done == [("receipt", 5, "me", message.id)]
        ship.enqueue(6)

    assert [run.message.task for run in runs] == [send_receipt.name, send_receipt.name, ship.name]
    assert runs.results == ["receipt 5", "receipt 6", 6]
    assert current_task() is None  # restored after each run
    assert keys_of(redis_client, prefix) == []


def test_eager_arguments_arrive_as_a_worker_reads_them(prefix):
    with run_eagerly() as runs:
        django_echo.enqueue((1, 2), when={"n": (3,)})  # django.tasks lets tuples through
    assert done == [("django", ([1, 2],), {"when": {"n": [3]}})]
    assert runs.results == [[[[1, 2]], {"when": {"n": [3]}}]]


def test_eager_errors_propagate_from_the_enqueue_or_are_kept(prefix):
    with run_eagerly() as runs, pytest.raises(ValueError, match="boom"):
        explode.enqueue("boom")
    assert [str(error) for error in runs.errors] == ["boom"]

    with run_eagerly(propagate=False) as runs:
        explode.enqueue("kept")
        returns_a_set.enqueue()
        echo_arguments.enqueue("after")
    assert [type(error) for error in runs.errors] == [ValueError, NonRetryableError]
    assert "not JSON-serializable" in str(runs.errors[1])
    assert runs.results == [[["after"], {}]]


def test_eager_runs_async_handlers_also_inside_an_event_loop(prefix):
    import asyncio

    with run_eagerly() as runs:
        async_double.enqueue(4)

        async def from_async_code():
            return async_double.enqueue(5)

        asyncio.run(from_async_code())
    assert runs.results == [
        {"double": 8, "task": async_double.name},
        {"double": 10, "task": async_double.name},
    ]


def test_eager_stops_tasks_that_keep_enqueueing_tasks(prefix):
    with run_eagerly(max_depth=4), pytest.raises(TooManyNestedTasks):
        enqueues_itself.enqueue(0)
    assert done == [0, 1, 2, 3]


@pytest.mark.django_db(transaction=True)
def test_eager_runs_django_tasks_and_tasks_enqueued_on_commit(prefix):
    with run_eagerly() as runs:
        result = dtasks.multiply.enqueue(6, 7)
        with transaction.atomic():
            send_receipt.enqueue_on_commit(8)
            assert done == []
        assert done[0][:2] == ("receipt", 8)
    assert runs.runs[0].message.id == result.id
    assert runs.results == [42, "receipt 8"]


# Tasks enqueued on commit, in a test whose transaction never commits


@pytest.mark.django_db
def test_a_task_waiting_for_the_tests_commit_is_named_by_the_failure(prefix, outbox_backend):
    with capture_tasks() as captured:
        dtasks.multiply.enqueue(2, 3)

    assert captured.tasks == [] and len(captured.waiting_for_commit()) == 1
    with pytest.raises(AssertionError) as failure:
        captured.assert_enqueued(dtasks.multiply)
    assert str(failure.value) == (
        "Expected tests.testapp.dtasks.multiply to be enqueued, but it was not.\n"
        "Nothing was enqueued.\n"
        "1 task enqueued on commit waits for a commit that has not happened (a test's transaction "
        "never commits):\n"
        "  - tests.testapp.dtasks.multiply(args=[2, 3], kwargs={}) queue='default'\n"
        "Run the on-commit callbacks to capture them: with TestCase.captureOnCommitCallbacks("
        "execute=True), or pytest-django's django_capture_on_commit_callbacks(execute=True) fixture, "
        "around the code that enqueues; or use a transactional test (TransactionTestCase, "
        "@pytest.mark.django_db(transaction=True))."
    )


@pytest.mark.django_db
def test_the_advice_of_the_failure_captures_the_task(
    prefix, outbox_backend, django_capture_on_commit_callbacks
):
    with capture_tasks() as captured, django_capture_on_commit_callbacks(execute=True):
        dtasks.multiply.enqueue(2, 3)
        send_receipt.enqueue_on_commit(7)

    captured.assert_enqueued(dtasks.multiply, args=[2, 3])
    captured.assert_enqueued(send_receipt, args=[7])
    assert captured.waiting_for_commit() == []


@pytest.mark.django_db
def test_enqueue_on_commit_waiting_is_listed_after_what_was_enqueued(prefix):
    with capture_tasks() as captured:
        echo_arguments.enqueue("now")
        send_receipt.enqueue_on_commit(7)

    with pytest.raises(AssertionError) as failure:
        captured.assert_enqueued(send_receipt, args=[7])
    lines = str(failure.value).splitlines()
    assert lines[1:4] == [
        "Enqueued (1):",
        f"  - {echo_arguments.name}(args=['now'], kwargs={{}}) queue='default'",
        "1 task enqueued on commit waits for a commit that has not happened "
        "(a test's transaction never commits):",
    ]
    assert lines[4] == f"  - {send_receipt.name}(args=[7], kwargs={{}}) queue='emails'"


@pytest.mark.django_db
def test_a_task_whose_savepoint_rolled_back_is_not_said_to_wait(prefix):
    with capture_tasks() as captured, pytest.raises(ZeroDivisionError), transaction.atomic():
        send_receipt.enqueue_on_commit(7)
        1 / 0  # noqa: B018

    assert captured.waiting_for_commit() == []
    with pytest.raises(AssertionError, match=r"Nothing was enqueued\.$"):
        captured.assert_enqueued(send_receipt)

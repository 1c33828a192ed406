"""Task registration and enqueue-time validation."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from django_rtq import Operations, enqueue_many, message_builder, task
from django_rtq.broker import TaskState
from django_rtq.exceptions import DuplicateTask, InvalidTask, TaskIdConflict
from django_rtq.registry import get_task_type, registered_tasks
from tests.testapp import tasks


def test_tasks_modules_are_autodiscovered():
    assert "tests.testapp.tasks.add" in registered_tasks()
    assert get_task_type("tests.testapp.tasks.add") is tasks.add


def test_a_task_type_is_still_callable_directly():
    assert tasks.add(2, 3) == 5


def test_enqueue_writes_a_pending_task_with_resolved_defaults(broker):
    message = tasks.add.enqueue(2, b=3)
    found = Operations().live_task(message.id)
    assert found.state == TaskState.PENDING
    assert found.message == message
    assert (message.args, message.kwargs, message.queue) == ([2], {"b": 3}, "default")
    assert message.max_retries == 5 and message.retention == 60.0 and message.timeout == 1800.0


def test_using_overrides_options_per_call(broker):
    message = tasks.add.using(queue="other", priority=7, max_retries=1, timeout=2, task_id="my-id").enqueue(
        1, 1
    )
    assert (message.queue, message.priority, message.max_retries, message.timeout, message.id) == (
        "other",
        7,
        1,
        2.0,
        "my-id",
    )
    assert Operations().live_task("my-id").queue == "other"


def test_delay_and_process_at_schedule_the_task(broker):
    delayed = tasks.add.using(delay=timedelta(minutes=5)).enqueue(1, 1)
    at = datetime.now(UTC) + timedelta(hours=1)
    timed = tasks.add.using(process_at=at).enqueue(1, 1)
    inspector = Operations()
    assert inspector.live_task(delayed.id).state == TaskState.SCHEDULED
    assert inspector.live_task(timed.id).score_at == pytest.approx(at.timestamp(), abs=0.01)


@pytest.mark.parametrize(
    ("args", "expected"),
    [((object(), 1), "must be JSON-serializable"), ((float("nan"), 1), "must be JSON-serializable")],
)
def test_non_json_arguments_are_refused_at_enqueue(broker, args, expected):
    with pytest.raises(InvalidTask, match=expected):
        tasks.add.enqueue(*args)
    assert Operations().count("default", TaskState.PENDING) == 0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"colour": "red"}, "Unknown option"),
        ({"priority": 101}, "priority must be an integer from -100 to 100"),
        ({"max_retries": -1}, "max_retries must be a non-negative integer"),
        ({"timeout": "soon"}, "timeout must be a non-negative number"),
        ({"queue": "a{b}"}, "Queue name"),
        ({"delay": 1, "process_at": 5}, "not both"),
        # Celery's expires=60, made a deadline: a moment in 1970, which would archive it unrun
        ({"deadline": 60}, r"read as epoch seconds, a moment in 1970; .*deadline=timedelta\(seconds=60\)"),
        ({"process_at": 3600.0}, r"process_at=timedelta\(seconds=3600.0\)"),
    ],
)
def test_bad_options_are_refused_with_a_clear_error(broker, options, expected):
    with pytest.raises(InvalidTask, match=expected):
        tasks.add.using(**options).enqueue(1, 2)


def test_unknown_decorator_option_is_refused():
    with pytest.raises(InvalidTask, match="Unknown option"):
        task(retires=3)(lambda: None)


def test_a_name_registered_twice_by_different_functions_is_refused():
    def first():
        pass

    def second():
        pass

    task(name="tests.twice")(first)
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        task(name="tests.twice")(second)


@pytest.mark.parametrize("task_id", ["order/42", "a b", "", "x" * 256, "100%", "é", "q?x", "a#b", "a\\b", 42])
def test_a_task_id_outside_the_rule_is_refused_at_prepare(task_id):
    with pytest.raises(InvalidTask, match="1 to 255 printable ASCII characters"):
        tasks.add.using(task_id=task_id).prepare(1, 1)


@pytest.mark.parametrize(
    "task_id", ["order-42", "order:42", "user@example.com", "a.b_c+d=e~f", "app.<locals>.f", "x" * 255]
)
def test_a_task_id_within_the_rule_is_kept(task_id):
    assert tasks.add.using(task_id=task_id).prepare(1, 1).id == task_id


def test_duplicate_task_id_is_refused(broker):
    tasks.add.using(task_id="same").enqueue(1, 1)
    with pytest.raises(TaskIdConflict, match="'same'"):
        tasks.add.using(task_id="same").enqueue(2, 2)


def test_unique_tasks_are_refused_while_queued(broker):
    tasks.add.using(unique=60).enqueue(1, 1)
    with pytest.raises(DuplicateTask):
        tasks.add.using(unique=60).enqueue(1, 1)
    tasks.add.using(unique=60).enqueue(1, 2)  # other arguments, another key
    tasks.add.using(unique_key="k").enqueue(5, 5)
    with pytest.raises(DuplicateTask):
        tasks.add.using(unique_key="k").enqueue(6, 6)


def test_enqueue_many_sends_everything_in_one_call(broker):
    messages = enqueue_many(
        [tasks.add.prepare(i, i) for i in range(50)] + [tasks.record.using(queue="other").prepare("x")]
    )
    inspector = Operations()
    assert inspector.count("default", TaskState.PENDING) == 50
    assert inspector.count("other", TaskState.PENDING) == 1
    assert len({m.id for m in messages}) == 51


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_waits_for_the_commit(broker):
    inspector = Operations()
    with transaction.atomic():
        message = tasks.add.enqueue_on_commit(1, 2)
        assert inspector.count("default", TaskState.PENDING) == 0
    assert inspector.live_task(message.id).state == TaskState.PENDING

    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.add.enqueue_on_commit(3, 4)
        raise RuntimeError
    with pytest.raises(Exception, match="No task"):
        inspector.live_task(rolled_back.id)


# Celery's habits, and functions a worker could not import


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        ("delay", "use add.enqueue(*args, **kwargs)."),
        ("apply_async", "add.using(delay=seconds, queue=..., priority=...).enqueue(*args, **kwargs)"),
        ("signature", "use add.s(*args, **kwargs)"),
        ("AsyncResult", "Operations().get_task(task_id)"),
    ],
)
def test_celerys_names_say_what_to_use_instead(attribute, expected):
    with pytest.raises(AttributeError) as raised:
        getattr(tasks.add, attribute)
    message = str(raised.value)
    assert message.startswith(f"'TaskType' object has no attribute '{attribute}' (Celery's name): ")
    assert expected in message
    assert message.endswith("docs/celery.md maps Celery's names to django-rtq's.")


def test_other_missing_attributes_raise_the_usual_error():
    with pytest.raises(AttributeError, match=r"^'TaskType' object has no attribute 'nope'$"):
        tasks.add.nope  # noqa: B018
    assert not hasattr(tasks.add, "nope") and getattr(tasks.add, "nope", None) is None


def test_a_lambda_is_refused_as_no_worker_could_import_it():
    name = "tests.test_registry.test_a_lambda_is_refused_as_no_worker_could_import_it.<locals>.<lambda>"
    with pytest.raises(ImproperlyConfigured) as refused:
        task(lambda x: x * 2)
    assert str(refused.value).startswith(f"@task cannot take a lambda ({name}): a worker imports a task type")
    assert not [name for name in registered_tasks() if "<lambda>" in name]


def test_a_nested_function_is_refused_as_no_worker_could_import_it():
    def double(x):
        return x * 2

    with pytest.raises(ImproperlyConfigured, match="cannot take a function defined inside another"):
        task(queue="default")(double)
    assert not [name for name in registered_tasks() if "<locals>" in name]


def test_a_lambda_given_a_name_is_taken(settings):
    from django_rtq.registry import unregister_task

    double = task(name="tests.registry.double")(lambda x: x * 2)
    try:
        assert get_task_type("tests.registry.double") is double and double(4) == 8
    finally:
        unregister_task("tests.registry.double")


def test_a_task_types_defaults_follow_the_settings_once_they_change(settings):
    before = tasks.add.prepare(1, 1)
    settings.RTQ = {**settings.RTQ, "DEFAULT_QUEUE": "elsewhere", "MAX_RETRIES": 2, "TIMEOUT": 9}
    after = tasks.add.prepare(1, 1)
    assert (before.queue, before.max_retries, before.timeout) == ("default", 5, 1800.0)
    assert (after.queue, after.max_retries, after.timeout) == ("elsewhere", 2, 9.0)


def test_an_invalid_option_is_refused_at_every_call_not_only_the_first():
    invalid = tasks.add.using(priority=500)
    for _ in range(2):
        with pytest.raises(InvalidTask, match="priority must be an integer"):
            invalid.prepare(1, 1)


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_an_infinite_argument_is_refused_like_nan(value):
    with pytest.raises(InvalidTask, match="must be JSON-serializable"):
        tasks.add.prepare(value, 1)


def test_a_call_with_options_of_its_own_and_a_plain_one_resolve_the_same_defaults():
    plain = tasks.add.prepare(1, b=2)
    delayed = tasks.add.using(delay=60).prepare(1, b=2)
    for name in ("queue", "priority", "max_retries", "timeout", "retention", "args", "kwargs"):
        assert getattr(plain, name) == getattr(delayed, name), name
    assert plain.process_at is None and delayed.process_at == pytest.approx(delayed.enqueued_at + 60)


def test_new_task_ids_are_22_url_safe_characters_never_led_by_a_dash(monkeypatch):
    ids = {message_builder.new_task_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{22}", task_id) for task_id in ids)
    # 16 random bytes whose base64 starts with "-" ("+" in the standard alphabet: 0b111110...)
    draws = iter([b"\xf8" + bytes(15), b"\x00" * 16])
    monkeypatch.setattr(message_builder.os, "urandom", lambda n: next(draws))
    assert message_builder.new_task_id() == "A" * 22

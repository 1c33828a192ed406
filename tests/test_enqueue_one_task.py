"""Enqueueing one task: one script call without a pipeline, refused as a call of several refuses
it, and a `django.tasks` task validated once."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_rtq.broker import Broker, TaskMessage, TaskState
from django_rtq.broker.keys import ENQUEUE_KEYS
from django_rtq.broker.scripts import LUA_DIR
from django_rtq.exceptions import DuplicateTask, TaskIdConflict
from tests.support.factories import BILLING, EMAILS, message
from tests.support.reading import column, ids_in, state_of
from tests.support.sent_commands import record_commands

# One task, one script call


def refusal(call) -> tuple[type, str]:
    with pytest.raises((TaskIdConflict, DuplicateTask)) as caught:
        call()
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("taken", "error"),
    [("id", TaskIdConflict), ("unique key", DuplicateTask), ("id and unique key", TaskIdConflict)],
)
def test_one_task_is_refused_as_a_call_of_several_refuses_it(any_broker: Broker, taken: str, error: type):
    holder = message(EMAILS, unique_key="report", unique_ttl=60)
    any_broker.enqueue([holder])
    fields: dict[str, Any] = {}
    if "id" in taken:
        fields["id"] = holder.id
    if "unique key" in taken:
        fields |= {"unique_key": "report", "unique_ttl": 60}
    latecomer = message(EMAILS, **fields)

    alone = refusal(lambda: any_broker.enqueue([latecomer]))
    with_another = refusal(lambda: any_broker.enqueue([latecomer, message(EMAILS)]))

    assert alone == with_another
    assert alone[0] is error
    assert ids_in(any_broker, EMAILS, TaskState.PENDING) == [holder.id]


def test_one_task_is_one_script_call_without_a_pipeline(any_broker: Broker, monkeypatch):
    any_broker.register_queues([EMAILS])
    sent = []
    record_commands(any_broker, monkeypatch, lambda command: sent.append(command[0]))
    monkeypatch.setattr(any_broker.client, "pipeline", lambda *a, **k: pytest.fail("a pipeline for one task"))
    task = message(EMAILS)

    any_broker.enqueue([task])

    assert sent == ["EVALSHA"]
    assert state_of(any_broker, EMAILS, task.id) == "pending"


def test_one_task_registers_its_queue(any_broker: Broker):
    any_broker.enqueue([message(BILLING)])

    assert any_broker.known_queues() == [BILLING]


def test_one_task_is_enqueued_where_the_script_is_not_loaded(any_broker: Broker, monkeypatch):
    unknown = dataclasses.replace(any_broker.scripts["enqueue"], sha="0" * 40)
    monkeypatch.setattr(any_broker, "scripts", {**any_broker.scripts, "enqueue": unknown})
    task = message(EMAILS)

    any_broker.enqueue([task])

    assert state_of(any_broker, EMAILS, task.id) == "pending"


def test_the_enqueue_keys_are_those_the_script_header_names_in_its_order(any_broker: Broker):
    header = (LUA_DIR / "enqueue.lua").read_text()
    named = re.findall(r"^-- KEYS\[\d+\] -> rtq:\{<queue>\}:(\w+)$", header, re.MULTILINE)
    qk = any_broker.queue(EMAILS)

    assert tuple(named) == ENQUEUE_KEYS
    assert qk.enqueue_keys == tuple(getattr(qk, name) for name in ENQUEUE_KEYS)


# The django.tasks backend


def test_a_django_task_is_validated_once_and_each_enqueue_still_honours_run_after(
    broker: Broker, monkeypatch
):
    from tests.testapp import dtasks

    backend = dtasks.multiply.get_backend()
    backend._known_task_types.clear()
    validated = []
    validate = type(backend).validate_task
    monkeypatch.setattr(
        type(backend), "validate_task", lambda self, task: validated.append(task) or validate(self, task)
    )

    first, second = dtasks.multiply.enqueue(2, 3), dtasks.multiply.enqueue(4, 5)
    later = dtasks.multiply.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(6, 7)

    assert validated.count(dtasks.multiply) == 1
    states = [state_of(broker, "default", result.id) for result in (first, second, later)]
    assert states == ["pending", "pending", "scheduled"]
    stored = column(broker, "default", "msg", second.id)
    assert TaskMessage.from_json(stored, id=second.id, queue="default").args == [4, 5]


class FixedBackoff:
    """A retry backoff that is not hashable (it compares by value)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, retried: int, exc: BaseException) -> float:
        return self.seconds

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedBackoff) and other.seconds == self.seconds

    __hash__ = None  # type: ignore[assignment]


def backed_off(a: int) -> int:
    return a


def test_a_django_task_with_an_option_that_cannot_be_hashed_is_enqueued(broker: Broker):
    try:
        from django.tasks import task
    except ImportError:  # Django 5.2 with the django-tasks backport
        from django_tasks import task

    # Django 6.0's form for django-rtq's options (6.1's @task(retry_backoff=...) is the same task).
    django_task = dataclasses.replace(task(backed_off), retry_backoff=FixedBackoff(1))
    results = [django_task.enqueue(1), django_task.enqueue(2)]

    assert [state_of(broker, "default", result.id) for result in results] == ["pending", "pending"]

"""A task's arguments are bound at prepare(), in the caller: a call that does not fit the
handler, or arguments that JSON would change, fail there rather than in a worker."""

from __future__ import annotations

import enum
import re

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_rtq import exceptions
from django_rtq.conf import RTQSettings
from django_rtq.periodic import load_entries
from tests.support.reading import pending_count
from tests.testapp import dtasks
from tests.testapp import tasks as testapp_tasks


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((1,), {}, "missing a required argument: 'b' (it takes (a, b))"),
        ((1, 2, 3), {}, "too many positional arguments"),
        ((1, 2), {"c": 3}, "unexpected keyword argument 'c'"),
        ((1,), {"a": 2}, "multiple values for argument 'a'"),
    ],
)
def test_a_call_that_does_not_fit_the_signature_fails_in_the_caller(broker, args, kwargs, expected):
    with pytest.raises(TypeError) as raised:
        testapp_tasks.add.enqueue(*args, **kwargs)
    assert isinstance(raised.value, exceptions.InvalidArguments)
    assert str(raised.value).startswith(
        "Task 'tests.testapp.tasks.add' cannot be called with these arguments: "
    )
    assert expected in str(raised.value)
    with pytest.raises(exceptions.InvalidArguments):
        testapp_tasks.add.prepare(*args, **kwargs)
    assert pending_count(broker) == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ((1, 2), 3),
            "The argument 0 of task 'tests.testapp.tasks.add' would reach the handler changed: "
            "a tuple decodes as a list (pass a list).",
        ),
        (([1, {"x": (2,)}], 3), "The argument 0[1]['x'] of task"),
        (
            ({1: "one"}, 3),
            "The argument 0[1] of task 'tests.testapp.tasks.add' would reach the handler "
            "changed: the key 1 decodes as the string '1'.",
        ),
        (([{None: 1}], 3), "the key None decodes as the string 'null'"),
    ],
)
def test_arguments_json_would_change_are_refused(broker, args, expected):
    with pytest.raises(exceptions.InvalidArguments) as raised:
        testapp_tasks.add.enqueue(*args)
    assert expected in str(raised.value)
    assert pending_count(broker) == 0


def test_an_enum_argument_is_refused_for_it_would_arrive_as_its_value(broker):
    class Size(enum.IntEnum):
        LARGE = 3

    with pytest.raises(exceptions.InvalidArguments, match=r"argument 1 .*: a Size decodes as a plain int"):
        testapp_tasks.add.enqueue(1, Size.LARGE)
    assert testapp_tasks.add.prepare(1, True).args == [1, True]  # bool is a type of its own in JSON


def test_keyword_arguments_are_named_where_they_would_change(broker):
    with pytest.raises(exceptions.InvalidArguments, match=r"The argument 'value'\[0\] of task"):
        testapp_tasks.record.enqueue("x", value=[(1, 2)])


def test_a_handler_taking_anything_takes_any_call(broker):
    message = testapp_tasks.takes_anything.enqueue(1, "two", three=[3])
    assert (message.args, message.kwargs) == ([1, "two"], {"three": [3]})
    assert pending_count(broker) == 1


def test_django_tasks_bind_their_arguments_and_keep_djangos_rule_for_tuples(broker):
    with pytest.raises(exceptions.InvalidArguments, match="missing a required argument: 'b'"):
        dtasks.multiply.enqueue(6)
    assert pending_count(broker) == 0
    result = dtasks.multiply.enqueue((1, 2), 2)  # Django's own backends hand the handler a list
    assert result.args == [[1, 2], 2]
    with pytest.raises(exceptions.InvalidArguments, match="the key 1 decodes as the string"):
        dtasks.multiply.enqueue({1: "a"}, 2)


def test_a_django_task_taking_its_context_is_bound_without_it(broker):
    assert dtasks.knows_its_context.enqueue("label").args == ["label"]
    with pytest.raises(exceptions.InvalidArguments, match=r"it takes \(label\)"):
        dtasks.knows_its_context.enqueue()


def test_a_periodic_schedule_whose_arguments_do_not_fit_is_a_configuration_error():
    with pytest.raises(
        ImproperlyConfigured, match=re.escape("Periodic task 'poll': Task 'tests.testapp.tasks.add' cannot")
    ):
        load_entries(
            RTQSettings(PERIODIC={"poll": {"task": "tests.testapp.tasks.add", "every": 5, "args": [1]}})
        )

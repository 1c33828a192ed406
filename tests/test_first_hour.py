"""A new user's first hour: the errors to catch come from `django_rtq`, a missing `django.tasks`
API is a system check error, and `rtq_task` shows each attempt's error readably."""

from __future__ import annotations

import enum
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

import django_rtq
from django_rtq import exceptions
from django_rtq.broker import Broker, TaskMessage, TaskState
from django_rtq.checks import TAG, check_queue_names, tasks_api_module
from django_rtq.conf import RTQSettings
from django_rtq.management.commands.rtq_task import error_lines, fact_text
from django_rtq.periodic import load_entries
from django_rtq.queue_names import named_queues
from django_rtq.worker import healthchecker
from django_rtq.worker.component import Component
from django_rtq.worker.healthchecker import Healthchecker
from django_rtq.worker.outcome import Failure, settle_failure
from django_rtq.worker.server import EXIT_REDIS_UNREACHABLE
from tests.support.checks import RTQ_BACKEND, ids, messages
from tests.support.clock import START_TIME
from tests.support.commands import START, fields_of, run
from tests.support.factories import EMAILS, WORKER, claim, enqueue
from tests.support.polling import wait_for
from tests.support.reading import pending_count
from tests.support.servers import free_port
from tests.testapp import dtasks
from tests.testapp import tasks as testapp_tasks

# The errors users catch


@pytest.mark.parametrize(
    "name",
    [
        "BrokerUnavailable",
        "BulkJobNotFound",
        "DeadlineExceeded",
        "DuplicateTask",
        "InvalidArguments",
        "InvalidStateTransition",
        "InvalidTask",
        "LeaseLost",
        "NonRetryableError",
        "QueueNotFound",
        "RTQError",
        "TaskCancelled",
        "TaskIdConflict",
        "TaskNotFound",
        "TaskTimeout",
        "WorkerShutdown",
    ],
)
def test_the_errors_users_catch_come_from_the_package(name):
    exported = getattr(django_rtq, name)

    assert exported is getattr(exceptions, name)
    assert name in django_rtq.__all__
    assert issubclass(exported, exceptions.RTQError)


def test_the_errors_of_enqueueing_import_from_the_package():
    from django_rtq import BrokerUnavailable, DuplicateTask, NonRetryableError, TaskIdConflict

    assert (DuplicateTask, TaskIdConflict, BrokerUnavailable, NonRetryableError) == (
        exceptions.DuplicateTask,
        exceptions.TaskIdConflict,
        exceptions.BrokerUnavailable,
        exceptions.NonRetryableError,
    )


# The django.tasks API (Django 6.0+, or the backport on Django 5.2): check E005


@contextmanager
def tasks_api_missing() -> Iterator[None]:
    """Inside, `django.tasks` and `django_tasks` cannot be imported (a None in sys.modules stops
    an import). Change settings.TASKS outside: their receivers of `setting_changed` import them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "django.tasks", None)
        patch.setitem(sys.modules, "django_tasks", None)
        yield


def test_the_check_finds_the_api_where_the_backend_does():
    from django_rtq.backends import BaseTaskBackend

    assert tasks_api_module() == BaseTaskBackend.__module__.removesuffix(".backends.base")


def test_without_the_tasks_api_no_module_is_found():
    with tasks_api_missing():
        assert tasks_api_module() is None


def test_the_rtq_backend_without_the_tasks_api_is_an_error(settings):
    settings.TASKS = {"default": {"BACKEND": RTQ_BACKEND, "QUEUES": ["default"]}}

    with tasks_api_missing():
        assert ids() == ["django_rtq.E005"]
        [message] = messages("django_rtq.E005")
        with pytest.raises(SystemCheckError, match=r"django_rtq\.E005.*tasks-backport"):
            call_command("check", "--tag", TAG)
    assert message.startswith("django_rtq.backends.RTQBackend (of 'default') needs the django.tasks API")
    assert 'pip install "django-rtq[tasks-backport]"' in message
    assert "Django 6.0+ has it built in" in message
    assert ids() == []  # once it can be imported again


def test_one_error_names_every_alias_of_the_rtq_backend(settings):
    settings.TASKS = {
        "default": {"BACKEND": RTQ_BACKEND},
        "local": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
        "emails": {"BACKEND": RTQ_BACKEND},
    }

    with tasks_api_missing():
        [message] = messages("django_rtq.E005")
    assert message.startswith("django_rtq.backends.RTQBackend (of 'default', 'emails') needs ")


@pytest.mark.parametrize(
    "tasks",
    [{}, {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}],
)
def test_without_the_rtq_backend_a_missing_tasks_api_is_fine(settings, tasks):
    settings.TASKS = tasks

    with tasks_api_missing():
        assert ids() == []


def test_without_a_tasks_setting_a_missing_tasks_api_is_fine(settings):
    del settings.TASKS

    with tasks_api_missing():
        assert ids() == []


# rtq_task: each attempt's error

BAD_ADDRESS_TRACEBACK = """\
Traceback (most recent call last):
  File "shop/tasks.py", line 12, in send_receipt
    send_mail(...)
ValueError: bad address
"""
GONE_TRACEBACK = """\
Traceback (most recent call last):
  File "shop/tasks.py", line 12, in send_receipt
    send_mail(...)
ConnectionError: the SMTP server went away
"""


def fail_attempt(broker: Broker, error: BaseException, traceback: str) -> TaskState | None:
    """Claim the task of EMAILS and settle its failure as a worker does."""
    [claimed] = claim(broker, EMAILS)
    message = TaskMessage.from_json(claimed.raw_message, id=claimed.id, queue=claimed.queue)
    failure = Failure(
        claimed=claimed, message=message, error=error, traceback=traceback, started_at=broker.clock()
    )
    return settle_failure(broker, failure, worker_id=WORKER)


def test_task_shows_each_attempt_error_with_its_traceback(rtq: Broker):
    [task_id] = enqueue(rtq, EMAILS, max_retries=3)
    assert fail_attempt(rtq, ValueError("bad address"), BAD_ADDRESS_TRACEBACK) == TaskState.RETRY
    assert rtq.forward(EMAILS) == 1  # due at once: a task type this process lacks has no backoff
    gone = ConnectionError("the SMTP server went away")
    assert fail_attempt(rtq, gone, GONE_TRACEBACK) == TaskState.RETRY

    output = run("rtq_task", task_id)

    fields = fields_of(output)
    assert fields["retried"] == "2"
    assert fields["last error"] == "builtins.ConnectionError: the SMTP server went away"
    assert fields["workers"] == f"{WORKER}, {WORKER}"
    assert fields["started_at"] == START
    errors = output.split("\nErrors, oldest first\n", 1)[1].splitlines()
    assert errors == [
        "  builtins.ValueError: bad address",
        "      Traceback (most recent call last):",
        '        File "shop/tasks.py", line 12, in send_receipt',
        "          send_mail(...)",
        "      ValueError: bad address",
        "",
        "  builtins.ConnectionError: the SMTP server went away",
        "      Traceback (most recent call last):",
        '        File "shop/tasks.py", line 12, in send_receipt',
        "          send_mail(...)",
        "      ConnectionError: the SMTP server went away",
    ]
    assert "{'" not in output and "['" not in output  # no Python reprs


def test_an_error_without_a_traceback_shows_its_whole_message():
    error = {"type": "tests.StepError", "message": "no input\nfor step 2", "traceback": ""}

    assert error_lines(error) == ["  tests.StepError: no input", "  for step 2"]


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("failed_at", START_TIME, START),
        ("workers", ["web-1:42:ab", "web-2:7:cd"], "web-1:42:ab, web-2:7:cd"),
        ("workers", [], None),
        ("progress", {"done": 2, "total": 5}, '{"done": 2, "total": 5}'),
        ("children", [{"id": "c1", "queue": "emails"}], '[{"id": "c1", "queue": "emails"}]'),
        ("recovered", 1, 1),
    ],
)
def test_attempt_facts_are_shown_as_text_not_reprs(key, value, text):
    assert fact_text(key, value) == text


# Arguments are bound at prepare(), in the caller


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


# A worker without Redis


def test_a_burst_worker_gives_up_on_an_unreachable_redis_with_a_non_zero_status(start_worker):
    port = free_port()
    process = start_worker("--burst", "--give-up-after", "1", RTQ_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == EXIT_REDIS_UNREACHABLE == 3, output
    assert "gives up: Redis has been unreachable for more than 1s" in output
    # Said once, by the healthchecker, and not as "Redis is unreachable: Redis is unreachable".
    assert [line for line in output.splitlines() if line.startswith("Redis is unreachable")] == [
        f"Redis is unreachable: Error 111 connecting to 127.0.0.1:{port}. Connection refused. The worker "
        "waits for it: tasks it holds keep running, and their outcomes are written once it is back."
    ]
    assert "pass skipped" not in output and "cannot claim" not in output


def test_supervised_burst_workers_give_up_too(start_worker):
    process = start_worker(
        "--burst",
        "--processes",
        "2",
        "--give-up-after",
        "1",
        RTQ_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 3, output
    assert output.count("gives up") == 2 and "restarting it" not in output


class Unreachable:
    """A broker whose Redis does not answer until told to."""

    def __init__(self) -> None:
        self.down = True

    def ping(self) -> bool:
        if self.down:
            raise exceptions.BrokerUnavailable(
                "Redis is unreachable: Error 111 connecting. Connection refused."
            )
        return True


def test_the_healthchecker_tells_an_outage_once_then_reminds_then_tells_its_end(caplog, monkeypatch):
    broker = Unreachable()
    checker = Healthchecker(broker=broker, interval=1)
    with caplog.at_level(logging.DEBUG, logger="django_rtq"):
        for _ in range(3):
            checker.run_once()
        assert [record.getMessage() for record in caplog.records] == [
            "Redis is unreachable: Error 111 connecting. Connection refused. The worker waits for it: "
            "tasks it holds keep running, and their outcomes are written once it is back."
        ]
        assert checker.outage_seconds() > 0
        monkeypatch.setattr(healthchecker, "OUTAGE_REMINDER_SECONDS", 0.0)
        checker.run_once()
        assert caplog.records[-1].getMessage().startswith("Redis still unreachable after ")
        broker.down = False
        checker.run_once()
        assert caplog.records[-1].getMessage().startswith("Redis is reachable again, after ")
        assert checker.outage_seconds() == 0


class SkippedByTheOutage(Component):
    name = "skipped"

    def __init__(self) -> None:
        super().__init__(interval=0.001)
        self.passes = 0

    def run_once(self) -> None:
        self.passes += 1
        raise exceptions.BrokerUnavailable("Redis is unreachable: gone")


def test_components_leave_the_outage_to_the_healthchecker(caplog):
    component = SkippedByTheOutage()
    with caplog.at_level(logging.DEBUG, logger="django_rtq"):
        component.start()
        wait_for(lambda: component.passes >= 50, message="passes of the component")
        component.stop()
    levels = {record.levelno for record in caplog.records if record.name == "django_rtq.worker.skipped"}
    assert levels == {logging.DEBUG}


# A queue name with a typo


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

"""Tasks declared with Django's own `@task` (django.tasks, or its backport on Django 5.2)."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

import asyncio
import inspect
import time
from dataclasses import replace

from django_rtq import NonRetryableError
from tests.testapp.tasks import ODD_ERRORS, client, report, report_key, run_recorded

#: Django 6.1 (and the backport) pass `@task`'s other options to the backend's task class; 6.0
#: takes Django's own only, and django-rtq's are added to the task it made (docs/django.md).
TASK_TAKES_OPTIONS = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(task).parameters.values())
DJANGO_OPTIONS = ("priority", "queue_name", "backend", "takes_context")


def rtq_task(**options):
    """`@task(**options)`, in the form this Django version takes."""
    if TASK_TAKES_OPTIONS:
        return task(**options)
    djangos = {name: options.pop(name) for name in DJANGO_OPTIONS if name in options}
    return lambda func: replace(task(**djangos)(func), **options)


@task
def multiply(a, b):
    return a * b


@task(queue_name="low", priority=10)
def low_priority(value):
    return value


@task
def fails():
    raise ValueError("django task failed")


@task
def fails_oddly(name, kind):
    """Report a run, then raise the odd error of `kind` (tests.testapp.tasks.ODD_ERRORS)."""
    report(f"{name}:ran", "1")
    raise ODD_ERRORS[kind]("odd")


@rtq_task(max_retries=2)
def fails_twice(name):
    attempt = client().incr(report_key(f"{name}:attempts"))
    if attempt <= 2:
        raise RuntimeError(f"attempt {attempt}")
    return attempt


@rtq_task(max_retries=2)
def refuses_a_retry(name):
    """Fail for good, retries left or not."""
    raise NonRetryableError(f"{name}: no use trying again")


@rtq_task(max_retries=2)
def waits_with_retries_left(name, seconds=20.0):
    """Report that it started, then wait (in Python, so that a stop raised in it lands) until
    `<name>:go` is pushed or `seconds` pass."""
    report(name, "started")
    until = time.time() + seconds
    while time.time() < until and not client().lpop(report_key(f"{name}:go")):
        time.sleep(0.01)
    return "done"


@rtq_task(takes_context=True, retention=60)
def knows_its_context(context, label):
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task
async def async_multiply(a, b):
    return a * b


@task
def waits(name):
    report(name, "started")
    client().blpop(report_key(f"{name}:go"), timeout=20)
    return "done"


@rtq_task(rate_limit="10/s", max_concurrency=2)
def flow_django_limited(name, seconds=0.15):
    """Flow control through Django's own `@task` (tests/test_flow_control_workers.py)."""
    run_recorded(name, seconds)


@rtq_task(takes_context=True, retention=60)
def reports_its_task(context):
    """Return the task and result its context gives it: the variant it was enqueued as."""
    result = context.task_result
    task = result.task
    return {
        "queue": task.queue_name,
        "priority": task.priority,
        "run_after": task.run_after.timestamp() if task.run_after else None,
        "backend": task.backend,
        "result_backend": result.backend,
        "id": result.id,
        "attempt": context.attempt,
    }


@rtq_task(retention=60)
def returns_what_json_cannot_keep():
    return {1, 2}


@rtq_task(max_retries=2, retention=60)
def fails_then_waits(name):
    """Fail the first attempt; in the next, report that it started and wait for `<name>:go`."""
    attempt = client().incr(report_key(f"{name}:attempts"))
    if attempt == 1:
        raise RuntimeError("first attempt")
    report(name, "started")
    client().blpop(report_key(f"{name}:go"), timeout=20)
    return attempt


@rtq_task(max_retries=2)
async def async_waits_with_retries_left(name, seconds=20.0):
    """`waits_with_retries_left`, as an `async def`: cancelled at an await."""
    report(name, "started")
    until = time.time() + seconds
    while time.time() < until and not client().lpop(report_key(f"{name}:go")):
        await asyncio.sleep(0.01)
    return "done"


def settles_on_6_0(order_id):
    return order_id


# Django 6.0's form for django-rtq's options (docs/django.md), on every version.
settles_on_6_0 = replace(task(queue_name="low", priority=3)(settles_on_6_0), max_retries=4, timeout=9.5)


@task
def snoozes_once_django(name, seconds=0.5):
    """Django's `@task` whose first run snoozes (no attempt counted); it then returns its name."""
    from django_rtq import Snooze

    if client().incr(report_key(f"{name}:runs")) == 1:
        raise Snooze(seconds)
    report(name, "woke")
    return name


def _page_key(page_id, title):
    return f"page:{page_id}"


@rtq_task(debounce=60, debounce_key=_page_key)
def reindex_page(page_id, title):
    """Debounced by the page only: the newest title wins (docs/debounce.md)."""
    return title

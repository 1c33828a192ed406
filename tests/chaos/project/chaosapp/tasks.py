"""The chaos project's tasks: `chaos_sleep` and `chaos_steps`, Django's own `@task`, and
`chaos_receipt`, django-rtq's `@task` (an order's receipt, enqueued on commit); no options."""

import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task

from chaosapp.runs import record
from django_rtq import task as rtq_task

#: The longest sleep of `chaos_steps`.
STEP_SECONDS = 0.05


@task
def chaos_sleep(key, ms):
    """Sleep `ms` milliseconds between a recorded start and a recorded end; `key` names the run.
    A run interrupted by an exception (a worker cancelling it, say) records `abort` instead."""
    record("start", key)
    try:
        time.sleep(ms / 1000)
        record("end", key)
    except BaseException:
        record("abort", key)
        raise
    return key


@task
def chaos_steps(key, ms):
    """`chaos_sleep` in sleeps of STEP_SECONDS: a handler the worker's watchdog stops at once (its
    exception lands between two sleeps), where one long `time.sleep` is C code it waits out."""
    record("start", key)
    try:
        until = time.monotonic() + ms / 1000
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, STEP_SECONDS))
        record("end", key)
    except BaseException:
        record("abort", key)
        raise
    return key


@rtq_task
def chaos_receipt(key, ms):
    """The same recorded sleep as `chaos_sleep`, as a task type of django-rtq's own."""
    return chaos_sleep.func(key, ms)

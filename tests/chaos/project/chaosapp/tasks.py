"""The chaos project's tasks: `chaos_sleep`, Django's own `@task`, and `chaos_receipt`,
django-rtq's `@task` (an order's receipt, enqueued on commit); no options."""

import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task

from chaosapp.runs import record
from django_rtq import task as rtq_task


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


@rtq_task
def chaos_receipt(key, ms):
    """The same recorded sleep as `chaos_sleep`, as a task type of django-rtq's own."""
    return chaos_sleep.func(key, ms)

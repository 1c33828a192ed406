"""The chaos project's task: Django's own `@task`, no options."""

import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task

from chaosapp.runs import record


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

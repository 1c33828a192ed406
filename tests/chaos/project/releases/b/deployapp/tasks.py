"""Release B's tasks: `c` with a new argument, the new `d` (Django's own `@task`, no options),
and `send_receipt`, moved to deployapp/receipts.py (imported here so that it is registered)."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task

from chaosapp.ledger import run, seconds_for

from deployapp.receipts import send_receipt  # noqa: F401

RELEASE = "b"


@task
def c(i, j=0):
    return run(f"c{i}", RELEASE, seconds_for(i), {"i": i, "j": j})


@task
def d(i):
    return run(f"d{i}", RELEASE, seconds_for(i), {"i": i})

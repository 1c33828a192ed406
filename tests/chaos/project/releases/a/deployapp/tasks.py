"""Release A's tasks: `c`, Django's own `@task`, and `receipt`, django-rtq's; no options."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task

from chaosapp.ledger import run, seconds_for

from django_rtq import task as rtq_task

RELEASE = "a"


@task
def c(i):
    return run(f"c{i}", RELEASE, seconds_for(i), {"i": i})


@rtq_task
def receipt(i):
    return run(f"r{i}", RELEASE, seconds_for(i), {"i": i})

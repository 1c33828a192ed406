"""South's task: `ship`, Django's own `@task`, no options."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task

from chaosapp.ledger import run, seconds_for

PROJECT = "south"


@task
def ship(i):
    return run(f"{PROJECT}{i}", PROJECT, seconds_for(i), {"i": i})

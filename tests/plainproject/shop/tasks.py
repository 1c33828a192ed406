"""Tasks written against Django's task API only."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task


@task
def total(prices):
    return sum(prices)


@task(takes_context=True)
def attempt(context):
    return context.attempt


@task
def broken():
    raise LookupError("no such product")

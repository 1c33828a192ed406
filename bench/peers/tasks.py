"""django-rtq's side: the four handlers as django-rtq `@task`s and as `django.tasks` tasks run by
`django_rtq.backends.RTQBackend`, and the driver's clients for both (bench/peers/driver.py).

Settings: bench.peers.rtq_settings, or bench.peers.rtq_defaults_settings for django.tasks at
django-rtq's defaults (this module is autodiscovered by the worker).
"""

from __future__ import annotations

import os

from django.tasks import task as django_task

from bench.peers import common
from django_rtq import enqueue_many, task
from django_rtq.conf import get_settings
from django_rtq.models import FinishedTask

DISTRIBUTIONS = ("django-rtq", "django", "redis", "hiredis", "psycopg")


@task
def empty(token: str = "") -> None:
    common.run("empty", token)


@task
def incr(token: str = "") -> None:
    common.run("incr", token)


@task
def orm(token: str = "") -> None:
    common.run("orm", token)


@task
def sleep(token: str = "") -> None:
    common.run("sleep", token)


if os.environ.get("BENCH_RTQ_LIMITED_TYPE"):
    # A project with a flow-control limit on a type the bench does not enqueue: every claim then
    # carries the limits and reads each task's type (docs/flow-control.md). Measures that cost.
    @task(rate_limit="20/s")
    def limited(token: str = "") -> None:
        common.run("empty", token)


@django_task(queue_name="bench")
def dj_empty(token: str = "") -> None:
    common.run("empty", token)


@django_task(queue_name="bench")
def dj_incr(token: str = "") -> None:
    common.run("incr", token)


@django_task(queue_name="bench")
def dj_orm(token: str = "") -> None:
    common.run("orm", token)


@django_task(queue_name="bench")
def dj_sleep(token: str = "") -> None:
    common.run("sleep", token)


NATIVE = {"empty": empty, "incr": incr, "orm": orm, "sleep": sleep}
DJANGO_TASKS = {"empty": dj_empty, "incr": dj_incr, "orm": dj_orm, "sleep": dj_sleep}


class NativeClient:
    """django-rtq's own API: `my_task.enqueue(...)`, and `enqueue_many` of prepared messages."""

    bulk = "enqueue_many"

    def enqueue(self, handler: str, token: str = "") -> None:
        NATIVE[handler].enqueue(token)

    def enqueue_many(self, handler: str, count: int) -> None:
        task_type = NATIVE[handler]
        enqueue_many([task_type.prepare("") for _ in range(count)])

    def reset(self) -> None:
        pass


class DjangoTasksClient:
    """Django's API, `my_task.enqueue(...)` of a `django.tasks` task: it has no bulk call."""

    bulk = None

    def enqueue(self, handler: str, token: str = "") -> None:
        DJANGO_TASKS[handler].enqueue(token)

    def reset(self) -> None:
        """With the ORM mirror on, delete the rows of this bench's finished tasks: RETENTION 0
        does not drop them (they are kept MIRROR_MAX_AGE), and every drain writes one a task."""
        if get_settings().MIRROR:
            FinishedTask.objects.filter(task_name__startswith="bench.peers.").delete()


CLIENTS = {
    "rtq": NativeClient(),
    "rtq-django": DjangoTasksClient(),
    "rtq-django-defaults": DjangoTasksClient(),
}

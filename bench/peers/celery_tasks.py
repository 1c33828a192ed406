"""Celery's side: the four handlers as Celery tasks (Redis broker, no result backend), and the
driver's client. Worker: `celery -A bench.peers.celery_tasks worker --pool threads
--concurrency N --without-gossip --without-mingle --without-heartbeat -Q bench`.

With Django set up, Celery's Django fixup closes the database connections before and after
every task unless CELERY_DB_REUSE_MAX is set: it is set high here, so that Celery's threads keep
their connections as every other system's do (the `orm` handler compares queues, not reconnects).
"""

from __future__ import annotations

from celery import Celery

from bench.peers import common

common.setup_django()

DISTRIBUTIONS = ("celery", "kombu", "django", "redis", "hiredis", "psycopg")
QUEUE = "bench"

app = Celery("bench", broker=common.REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
app.conf.CELERY_DB_REUSE_MAX = 10**9  # read by celery.fixups.django.DjangoWorkerFixup


@app.task
def empty(token: str = "") -> None:
    common.run("empty", token)


@app.task
def incr(token: str = "") -> None:
    common.run("incr", token)


@app.task
def orm(token: str = "") -> None:
    common.run("orm", token)


@app.task
def sleep(token: str = "") -> None:
    common.run("sleep", token)


TASKS = {"empty": empty, "incr": incr, "orm": orm, "sleep": sleep}


class Client:
    """`my_task.delay(...)` enqueues; Celery has no bulk call for plain tasks (a `group`
    publishes one message per task)."""

    bulk = None

    def enqueue(self, handler: str, token: str = "") -> None:
        TASKS[handler].delay(token)

    def reset(self) -> None:
        """After a FLUSHALL: declare the queue again (its binding was a Redis key), since the
        producer remembers it declared it and would publish to no queue."""
        with app.connection_for_write() as connection:
            app.amqp.queues[QUEUE].bind(connection.default_channel).declare()


CLIENTS = {"celery": Client()}

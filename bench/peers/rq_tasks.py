"""RQ's side: the four handlers as plain functions RQ jobs call, and the driver's client.
Worker: `rq worker -w rq.worker.SimpleWorker bench` (one job at a time, no fork per job)."""

from __future__ import annotations

import redis
from rq import Queue

from bench.peers import common

common.setup_django()

DISTRIBUTIONS = ("rq", "django", "redis", "hiredis", "psycopg")

queue = Queue("bench", connection=redis.Redis.from_url(common.REDIS_URL))


def empty(token: str = "") -> None:
    common.run("empty", token)


def incr(token: str = "") -> None:
    common.run("incr", token)


def orm(token: str = "") -> None:
    common.run("orm", token)


def sleep(token: str = "") -> None:
    common.run("sleep", token)


FUNCTIONS = {"empty": empty, "incr": incr, "orm": orm, "sleep": sleep}


class Client:
    """`queue.enqueue(func, ...)`, and `queue.enqueue_many` of `Queue.prepare_data(...)`."""

    bulk = "enqueue_many"

    def enqueue(self, handler: str, token: str = "") -> None:
        queue.enqueue(FUNCTIONS[handler], token)

    def enqueue_many(self, handler: str, count: int) -> None:
        func = FUNCTIONS[handler]
        queue.enqueue_many([Queue.prepare_data(func, ("",)) for _ in range(count)])

    def reset(self) -> None:
        pass


CLIENTS = {"rq": Client()}

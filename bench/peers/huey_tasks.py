"""huey's side: the four handlers as huey tasks on a `RedisHuey` (its defaults: blocking reads),
and the driver's client. Worker: `huey_consumer bench.peers.huey_tasks.huey -k thread -w N`."""

from __future__ import annotations

from huey import RedisHuey

from bench.peers import common

common.setup_django()

DISTRIBUTIONS = ("huey", "django", "redis", "hiredis", "psycopg")

huey = RedisHuey("bench", url=common.REDIS_URL)


@huey.task()
def empty(token: str = "") -> None:
    common.run("empty", token)


@huey.task()
def incr(token: str = "") -> None:
    common.run("incr", token)


@huey.task()
def orm(token: str = "") -> None:
    common.run("orm", token)


@huey.task()
def sleep(token: str = "") -> None:
    common.run("sleep", token)


TASKS = {"empty": empty, "incr": incr, "orm": orm, "sleep": sleep}


class Client:
    """`my_task(...)` enqueues; huey has no bulk call (`map` enqueues one by one)."""

    bulk = None

    def enqueue(self, handler: str, token: str = "") -> None:
        TASKS[handler](token)

    def reset(self) -> None:
        pass


CLIENTS = {"huey": Client()}

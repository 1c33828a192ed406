"""Dramatiq's side: the four handlers as actors on a `RedisBroker` (default middleware), and the
driver's client. Worker: `dramatiq bench.peers.dramatiq_tasks --processes P --threads N`."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers import common

common.setup_django()

DISTRIBUTIONS = ("dramatiq", "django", "redis", "hiredis", "psycopg")

broker = RedisBroker(url=common.REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench")
def empty(token: str = "") -> None:
    common.run("empty", token)


@dramatiq.actor(queue_name="bench")
def incr(token: str = "") -> None:
    common.run("incr", token)


@dramatiq.actor(queue_name="bench")
def orm(token: str = "") -> None:
    common.run("orm", token)


@dramatiq.actor(queue_name="bench")
def sleep(token: str = "") -> None:
    common.run("sleep", token)


ACTORS = {"empty": empty, "incr": incr, "orm": orm, "sleep": sleep}


class Client:
    """`actor.send(...)` enqueues; Dramatiq has no bulk call (`group(...).run()` sends one by one)."""

    bulk = None

    def enqueue(self, handler: str, token: str = "") -> None:
        ACTORS[handler].send(token)

    def reset(self) -> None:
        pass


CLIENTS = {"dramatiq": Client()}

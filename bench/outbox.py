"""What the transactional outbox costs a request: a transaction that saves an order and
`enqueue_on_commit()`s its receipt, with the outbox and without it. A script, not a test.

Run from the repository root:

    python bench/outbox.py [--database sqlite|postgresql] [--requests 2000] [--repeat 5]
                           [--redis-url redis://127.0.0.1:6379/0]

Each "request" is `with transaction.atomic():` one INSERT of an order row (raw SQL, as cheap
as a write gets), then `send_receipt.enqueue_on_commit(order_id)`. Measured, alternating, in
`--repeat` rounds (the median is printed): the order alone; with `RTQ["OUTBOX"] = False`, the
code path of django-rtq before the outbox (the task is sent from `on_commit`, not stored); with
the outbox (stored in the transaction, sent at the commit, its row deleted); and with the
outbox while Redis is unreachable (the row stays; the process does not try Redis again for
5 s). The database is an SQLite file (the default journal) or a throwaway PostgreSQL database
on 127.0.0.1:5432, both with Django's default settings; the Redis keys are under a prefix of
their own, deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"
DEAD_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
INSERT_ORDER = "INSERT INTO bench_order (id, email) VALUES (%s, %s)"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--requests", type=int, default=2000, help="requests per measure")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the median of each is printed")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or "redis://127.0.0.1:6379/0")
    return parser.parse_args()


def database_settings(kind: str, name: str) -> dict:
    if kind == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("RTQ_TEST_PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("RTQ_TEST_PGPORT", "5432"),
        "USER": os.environ.get("RTQ_TEST_PGUSER", "postgres"),
        "NAME": name,
    }


def create_pg_database(name: str, *, drop: bool = False) -> None:
    import psycopg

    settings = database_settings("postgresql", "postgres")
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname="postgres",
        autocommit=True,
    ) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if not drop:
            connection.execute(f'CREATE DATABASE "{name}"')


def setup_django(args: argparse.Namespace, prefix: str, database: dict) -> None:
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != Path(here)]
    sys.path.insert(0, str(REPO_ROOT))
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench-only",
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_rtq"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        RTQ={"REDIS_URL": args.redis_url, "KEY_PREFIX": prefix, "QUEUES": {QUEUE: 1}, "DEFAULT_QUEUE": QUEUE},
    )
    django.setup()


def send_receipt(order_id: int) -> None:
    """The task enqueued on commit (never run here)."""


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-outbox-{uuid.uuid4().hex[:10]}"
    if args.database == "sqlite":
        name = os.path.join(tempfile.mkdtemp(prefix="rtq-bench-"), "outbox.sqlite3")
    else:
        name = f"rtq_bench_outbox_{os.getpid()}"
        create_pg_database(name)
    setup_django(args, prefix, database_settings(args.database, name))
    try:
        return run(args)
    finally:
        from django.db import connections

        from django_rtq import get_broker

        connections.close_all()
        client = get_broker().client
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        if args.database == "postgresql":
            create_pg_database(name, drop=True)


def run(args: argparse.Namespace) -> int:
    import django
    import redis
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.test.utils import override_settings

    from django_rtq import get_broker, task
    from django_rtq.models import OutboxTask

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_order (id BIGINT PRIMARY KEY, email VARCHAR(200) NOT NULL)")
    receipt = task(send_receipt)
    broker = get_broker()
    rtq = dict(settings.RTQ)
    order_ids = iter(range(1, 10**9))

    def request(enqueue: bool) -> None:
        with transaction.atomic():
            order_id = next(order_ids)
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO bench_order (id, email) VALUES (%s, %s)", [order_id, "a@example.com"]
                )
            if enqueue:
                receipt.enqueue_on_commit(order_id)

    def clear() -> None:
        for key in broker.client.scan_iter(match=broker.keys.queue_prefix(QUEUE) + "*", count=1000):
            broker.client.delete(key)
        OutboxTask.objects.all().delete()
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM bench_order")

    def measure(enqueue: bool, **rtq_settings) -> float:
        """Microseconds per request, with these RTQ settings."""
        clear()
        with override_settings(RTQ={**rtq, **rtq_settings}):
            request(enqueue)  # warm-up: the broker, the script cache
            start = time.perf_counter()
            for _ in range(args.requests):
                request(enqueue)
            elapsed = time.perf_counter() - start
        # Leaving override_settings resets the broker, and with it the pause after an outage.
        return elapsed / args.requests * 1e6

    variants = {
        "the order alone (no task)": lambda: measure(False),
        "+ enqueue_on_commit, OUTBOX off (as before the outbox)": lambda: measure(True, OUTBOX=False),
        "+ enqueue_on_commit, with the outbox": lambda: measure(True),
        "+ enqueue_on_commit, with the outbox, Redis unreachable": lambda: measure(
            True, REDIS_URL=DEAD_REDIS_URL, REDIS_OPTIONS={"retry": None}
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, run_once in variants.items():
            times[name].append(run_once())
    kept = OutboxTask.objects.count()  # the last round's, Redis unreachable

    print(
        f"bench outbox: {connection.vendor}, Python {platform.python_version()}, Django "
        f"{django.get_version()}, redis-py {redis.__version__}, Redis "
        f"{broker.client.info('server')['redis_version']}, {args.requests} requests x {args.repeat} "
        f"rounds, load average {os.getloadavg()[0]:.2f}"
    )
    medians = {name: statistics.median(values) for name, values in times.items()}
    alone, before, after, away = medians.values()
    for name, micros in medians.items():
        print(f"  {name}: {micros:,.0f} µs a request = {1e6 / micros:,.0f} requests/s")
    print(
        f"  the outbox costs {after - before:+,.0f} µs a request over sending from on_commit "
        f"({after / before:.2f}x); the task itself, sent: {before - alone:,.0f} µs, stored and sent: "
        f"{after - alone:,.0f} µs; a request while Redis is away: {away:,.0f} µs "
        f"({kept} rows kept by its last round)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

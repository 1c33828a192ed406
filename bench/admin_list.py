"""How fast the admin's task list is on a big queue. A script, not a test.

Run from the repository root:

    python bench/admin_list.py [--tasks 1000000] [--requests 20] [--redis-url redis://127.0.0.1:6379/0]

It fills the archived set of a queue with `--tasks` tasks (messages and attempt facts as the
worker writes them, in pipelined chunks), then times pages of the admin's archived list through
the Django test client as a logged-in superuser: the first and the last page of that queue, the
first page of a queue holding one page of tasks (what rendering the rows costs) and that of an
empty queue, `--requests` times each, and prints the median (and p90). A page is one ZCARD and
one ZRANGE with offsets, so the figures should not depend on the queue's size. The run uses a
fresh key prefix ("rtqbench-<random>") and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
QUEUE = "bench"
SMALL_QUEUE = "bench-small"  # one page of tasks: what rendering the rows costs alone
EMPTY_QUEUE = "bench-empty"
#: Tasks written per pipelined chunk while filling.
FILL_CHUNK = 20_000
#: Requests made and thrown away before timing (templates compiled, connections open).
WARMUP_REQUESTS = 3

urlpatterns: list = []  # this module is the URLconf (ROOT_URLCONF below): the admin only


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000, help="archived tasks in the big queue")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per figure")
    parser.add_argument(
        "--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL, help="Redis to use"
    )
    return parser.parse_args()


def setup_django(redis_url: str, prefix: str) -> None:
    # `python bench/admin_list.py` puts bench/ first on sys.path; the repo root is what we need.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != here]
    sys.path.insert(0, str(REPO_ROOT))
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench-only",
        DEBUG=False,
        USE_TZ=True,
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_rtq",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        ROOT_URLCONF=__name__,
        STATIC_URL="/static/",
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        RTQ={
            "REDIS_URL": redis_url,
            "KEY_PREFIX": prefix,
            "QUEUES": {QUEUE: 1, SMALL_QUEUE: 1, EMPTY_QUEUE: 1},
        },
    )
    django.setup()
    from django.contrib import admin
    from django.urls import path

    urlpatterns.append(path("admin/", admin.site.urls))


def fill_archived(queue: str, count: int) -> float:
    """Write `count` archived tasks to `queue` the way the worker leaves them; return seconds taken."""
    from django_rtq import get_broker
    from django_rtq.broker import TaskMessage

    broker = get_broker()
    qk = broker.queue(queue)
    now = broker.clock()
    # One realistic message and attempt record, with the id and a per-task argument spliced in.
    proto = TaskMessage(
        id="@ID@",
        task="shop.emails.send_order_confirmation",
        queue=queue,
        args=["@N@"],
        kwargs={"template": "order_confirmation", "locale": "en-GB", "cc_support": False},
        max_retries=5,
        timeout=30.0,
        retention=86400.0,
        enqueued_at=now - 3600,
    ).to_json()
    head, rest = proto.split('"@ID@"')
    middle, tail = rest.split('"@N@"')
    info = (
        '{"retried":5,"error":"Connection refused by smtp.example.com:587",'
        '"error_type":"builtins.ConnectionRefusedError","worker":"web-3:4121:9f2c1a7e",'
        f'"started_at":{now - 60},"failed_at":{now - 59},'
        '"traceback":"Traceback (most recent call last):\\n  File \\"shop/emails.py\\", line 88, '
        "in send_order_confirmation\\n    smtp.send(message)\\nConnectionRefusedError: [Errno 111] "
        'Connection refused\\n"}'
    )
    run = uuid.uuid4().hex[:8]
    start = time.perf_counter()
    for first in range(0, count, FILL_CHUNK):
        numbers = range(first, min(first + FILL_CHUNK, count))
        ids = [f"{run}-{n:07d}" for n in numbers]
        pipe = broker.client.pipeline(transaction=False)
        pipe.hset(
            qk.msg, mapping={i: f'{head}"{i}"{middle}{n}{tail}' for i, n in zip(ids, numbers, strict=True)}
        )
        pipe.hset(qk.state, mapping=dict.fromkeys(ids, "archived"))
        pipe.hset(qk.info, mapping=dict.fromkeys(ids, info))
        archived_at_ms = int((now - 30) * 1000)
        pipe.zadd(qk.archived, {i: archived_at_ms + n for i, n in zip(ids, numbers, strict=True)})
        pipe.execute()
    broker.client.sadd(broker.keys.queues, queue, EMPTY_QUEUE)
    return time.perf_counter() - start


def time_pages(client, url: str, requests: int, expect_rows: int) -> list[float]:
    """Fetch `url` `requests` times (after a warm-up); return the times in milliseconds."""
    times = []
    for n in range(WARMUP_REQUESTS + requests):
        start = time.perf_counter()
        response = client.get(url)
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 200:
            raise SystemExit(f"bench: {url} answered {response.status_code}")
        rows = response.content.count(b"<tr data-task-id=")
        if rows != expect_rows:
            raise SystemExit(f"bench: {url} listed {rows} tasks, expected {expect_rows}")
        if n >= WARMUP_REQUESTS:
            times.append(elapsed)
    return times


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):.0f} ms (p90 {p90:.0f} ms, min {ordered[0]:.0f} ms)"


def delete_keys(prefix: str) -> None:
    from django_rtq import get_broker

    client = get_broker().client
    batch = []
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) == 500:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-{uuid.uuid4().hex[:10]}"
    setup_django(args.redis_url, prefix)
    import django
    import redis
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    from django_rtq import get_broker
    from django_rtq.admin_views.tasks import PER_PAGE

    setup_test_environment()
    call_command("migrate", verbosity=0)
    client = Client()
    client.force_login(User.objects.create_superuser("bench", "bench@example.com", "bench"))
    server = get_broker().client.info("server")
    print(
        f"bench: Python {platform.python_version()}, Django {django.get_version()}, "
        f"redis-py {redis.__version__}, Redis server {server.get('redis_version')}, {os.cpu_count()} cores",
        flush=True,
    )
    print(f"bench: key prefix {prefix}, queue {QUEUE!r}", flush=True)
    try:
        took = fill_archived(QUEUE, args.tasks)
        fill_archived(SMALL_QUEUE, PER_PAGE)
        print(f"fill: {args.tasks:,} archived tasks written in {took:.1f} s", flush=True)
        listing = "/admin/django_rtq/livetask/tasks/archived/"
        last_page = -(-args.tasks // PER_PAGE)
        first = time_pages(client, f"{listing}?queue={QUEUE}", args.requests, min(PER_PAGE, args.tasks))
        print(f"archived list, first page of {args.tasks:,} tasks: {summary(first)}", flush=True)
        last = time_pages(
            client,
            f"{listing}?queue={QUEUE}&page={last_page}",
            args.requests,
            args.tasks - (last_page - 1) * PER_PAGE,
        )
        print(f"archived list, last page (page {last_page:,}) of {args.tasks:,} tasks: {summary(last)}")
        small = time_pages(client, f"{listing}?queue={SMALL_QUEUE}", args.requests, PER_PAGE)
        print(f"archived list, first page of {PER_PAGE} tasks: {summary(small)}", flush=True)
        empty = time_pages(client, f"{listing}?queue={EMPTY_QUEUE}", args.requests, 0)
        print(f"archived list, first page of an empty queue: {summary(empty)}", flush=True)
    finally:
        delete_keys(prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())

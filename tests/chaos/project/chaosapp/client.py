"""What the project's own code does, as a process of its own:

    python -m chaosapp.client enqueue SPECS OUT [--batch N] [--interval SECONDS]
    python -m chaosapp.client orders SPECS OUT [--django-task]
    python -m chaosapp.client results IDS

`enqueue` reads `<key> <ms>` lines and enqueues `chaos_sleep(key, ms)`, one by one through
Django's task API or `--batch` at a time through `django_rtq.enqueue_many`, a batch every
`--interval` seconds; it appends `ok <key> <id>` once an enqueue returned (acknowledged),
`fail <key> <error>` if it raised, and `done` at the end.

`orders` reads `<key> <ms> commit` or `<key> <ms> rollback` lines and makes one request per
line through Django's handler and middleware (the test client): POST /orders/<key> (with
`--django-task`, /orders/<key>/django-task), and `?fail=1` for a rollback. It appends `ok <key>
<task id>` once a commit answered 200, `rolled_back <key> <status>` once a rollback answered
500, `fail <key> <status>` for any other answer, and at the end `done <seconds> <slowest>`: how
long the requests took, all and the slowest one.

`results` prints how Django's `get_result` reports the ids of a file, as JSON."""

import argparse
import json
import time

import django

django.setup()

from django.test import Client  # noqa: E402

from chaosapp.tasks import chaos_sleep  # noqa: E402
from django_rtq import enqueue_many  # noqa: E402

try:
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2
    from django_tasks.exceptions import TaskResultDoesNotExist


def enqueue(specs_path: str, out_path: str, batch: int, interval: float) -> None:
    with open(specs_path) as specs:
        calls = [(key, int(ms)) for key, ms in (line.split() for line in specs if line.strip())]
    start = time.monotonic()
    with open(out_path, "a") as out:
        for n, first in enumerate(range(0, len(calls), batch)):
            pause = start + n * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the pace of a steady stream of enqueues
            chunk = calls[first : first + batch]
            lines = []
            try:
                if batch == 1:
                    key, ms = chunk[0]
                    lines.append(f"ok {key} {chaos_sleep.enqueue(key, ms).id}")
                else:
                    messages = [chaos_sleep.rtq_task_type.prepare(key, ms) for key, ms in chunk]
                    enqueue_many(messages)
                    keys = [key for key, _ in chunk]
                    lines += [f"ok {key} {message.id}" for key, message in zip(keys, messages, strict=True)]
            except Exception as exc:
                lines += [f"fail {key} {type(exc).__name__}" for key, _ in chunk]
            out.write("".join(line + "\n" for line in lines))
            out.flush()
        out.write("done\n")


def orders(specs_path: str, out_path: str, django_task: bool) -> None:
    client = Client(raise_request_exception=False)
    suffix = "/django-task" if django_task else ""
    with open(specs_path) as specs:
        calls = [line.split() for line in specs if line.strip()]
    start = time.monotonic()
    slowest = 0.0
    with open(out_path, "a") as out:
        for key, ms, outcome in calls:
            query = f"ms={ms}&fail=1" if outcome == "rollback" else f"ms={ms}"
            sent = time.monotonic()
            response = client.post(f"/orders/{key}{suffix}?{query}")
            slowest = max(slowest, time.monotonic() - sent)
            if outcome == "commit" and response.status_code == 200:
                out.write(f"ok {key} {response.content.decode()}\n")
            elif outcome == "rollback" and response.status_code == 500:
                out.write(f"rolled_back {key} {response.status_code}\n")
            else:
                out.write(f"fail {key} {response.status_code}\n")
            out.flush()
        out.write(f"done {time.monotonic() - start:.3f} {slowest:.3f}\n")


def results(ids_path: str) -> None:
    counts: dict[str, int] = {}
    bad = []
    with open(ids_path) as ids:
        for result_id in (line.strip() for line in ids if line.strip()):
            try:
                result = chaos_sleep.get_result(result_id)
                status = str(result.status)
                errors = [error.exception_class_path for error in result.errors]
            except TaskResultDoesNotExist:
                status, errors = "MISSING", []
            counts[status] = counts.get(status, 0) + 1
            if status != "SUCCESSFUL" and len(bad) < 50:
                bad.append([result_id, status, errors])
    print(json.dumps({"counts": counts, "bad": bad}))


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    enqueue_parser = commands.add_parser("enqueue")
    enqueue_parser.add_argument("specs")
    enqueue_parser.add_argument("out")
    enqueue_parser.add_argument("--batch", type=int, default=1)
    enqueue_parser.add_argument("--interval", type=float, default=0.0)
    orders_parser = commands.add_parser("orders")
    orders_parser.add_argument("specs")
    orders_parser.add_argument("out")
    orders_parser.add_argument("--django-task", action="store_true")
    results_parser = commands.add_parser("results")
    results_parser.add_argument("ids")
    args = parser.parse_args()
    if args.command == "enqueue":
        enqueue(args.specs, args.out, args.batch, args.interval)
    elif args.command == "orders":
        orders(args.specs, args.out, args.django_task)
    else:
        results(args.ids)


if __name__ == "__main__":
    main()

"""What a project's web process does, as a process of its own: enqueue calls of its task types.

    python -m caller SPECS OUT [--interval SECONDS]

SPECS has one JSON object a line, `{"key", "task", "args", "kwargs"}`: the task type of the
dotted path `task` (Django's `@task` or django-rtq's) is imported from this process's code and
enqueued with these arguments through its own `.enqueue()`, one every `--interval` seconds.
It appends `ok <key> <id>` to OUT once an enqueue returned, `fail <key> <error>` if it raised,
and `done` at the end. The same module serves every project and release of the chaos suite:
which code it enqueues is the code on its path."""

import argparse
import json
import time

import django

django.setup()

from django.utils.module_loading import import_string  # noqa: E402


def call(specs_path: str, out_path: str, interval: float) -> None:
    with open(specs_path) as specs:
        calls = [json.loads(line) for line in specs if line.strip()]
    start = time.monotonic()
    with open(out_path, "a") as out:
        for n, spec in enumerate(calls):
            pause = start + n * interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # the pace of a steady stream of requests
            try:
                task_id = import_string(spec["task"]).enqueue(*spec["args"], **spec["kwargs"]).id
                line = f"ok {spec['key']} {task_id}"
            except Exception as exc:
                line = f"fail {spec['key']} {type(exc).__name__}"
            out.write(line + "\n")
            out.flush()
        out.write("done\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("specs")
    parser.add_argument("out")
    parser.add_argument("--interval", type=float, default=0.0)
    args = parser.parse_args()
    call(args.specs, args.out, args.interval)


if __name__ == "__main__":
    main()

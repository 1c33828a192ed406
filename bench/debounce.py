"""Debounce: enqueues in vs runs out for bursts, and what it costs task types without it.

Run from the repository root (a script, not a test):

    python bench/debounce.py [--keys 20] [--burst 100] [--repeat 5] [--calls 3000]
                             [--before REV] [--redis-url redis://127.0.0.1:6379/0]

It prints:
- the enqueue script's cost for a task without debounce, this tree's against the release
  before debounce (`--before`, by default the parent of the commit that added it): the two
  scripts' sources (with the helpers they use) loaded side by side and called in turns, call by
  call, with the same arguments; per run the median call, then the median of `--repeat` runs of
  `--calls` calls each; and whether the claim script changed at all;
- the whole `enqueue()` of a task without debounce (Python and Redis) in a process of each
  tree, the one before (from `git archive`) and this one, in turns (medians, µs per enqueue);
  and that of a debounced one merged into the copy that waits;
- bursts against a real worker process: `--keys` keys enqueued `--burst` times each, faster
  than the window (0.5 s); the enqueues in, the runs out, and whether every run had its key's
  last arguments (medians over `--repeat` runs).
Every run uses a key prefix of its own and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

# bench/ is first on sys.path when this runs as a script
from throughput import (
    DEFAULT_REDIS_URL,
    REPO_ROOT,
    delete_keys,
    header,
    ping_line,
    setup_django,
    start_worker,
    stop_worker,
)

QUEUE = "bench"
#: How long a burst's runs may take to come out after its last enqueue, past the window.
RUNS_TIMEOUT = 30.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=20, help="keys enqueued per burst run")
    parser.add_argument("--burst", type=int, default=100, help="enqueues of each key per burst run")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each measure; medians printed")
    parser.add_argument("--calls", type=int, default=3000, help="enqueues per cost measure")
    parser.add_argument("--before", default=None, help="the git revision to compare the scripts with")
    parser.add_argument("--redis-url", default=os.environ.get("RTQ_REDIS_URL") or DEFAULT_REDIS_URL)
    return parser.parse_args()


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout


def revision_before_debounce() -> str:
    """The parent of the first commit whose message module knew `debounce_key`."""
    added = git("log", "--reverse", "--format=%H", "-S", "debounce_key", "--", "django_rtq/broker/message.py")
    return added.split()[0] + "^"


def script_source(name: str, revision: str | None) -> str:
    """A script as the loader builds it (the helpers it uses, then its body), at `revision`
    (None: this tree)."""
    from django_rtq.broker import scripts

    if revision is None:
        return scripts.load_scripts()[name].source
    lib = git("show", f"{revision}:django_rtq/broker/lua/_lib.lua")
    body = git("show", f"{revision}:django_rtq/broker/lua/{name}.lua")
    return scripts._used_helpers(scripts._helpers(lib), body) + "\n" + body


def script_cost(broker, before: str, calls: int, repeat: int) -> tuple[list[float], list[float]]:
    """Per run, the median µs of a call of the enqueue script, before and now, for a task
    without debounce: the two called in turns, call by call, so that the load of the box
    weighs on both alike."""
    from django_rtq.broker.broker import _enqueue_args
    from django_rtq.broker.message import TaskMessage

    client = broker.client
    shas = {
        which: client.script_load(script_source("enqueue", rev))
        for which, rev in (("before", before), ("now", None))
    }
    qk = broker.queue(QUEUE)
    keys = list(qk.enqueue_keys)
    base = [broker.clock_arg(), qk.wake_channel, "", broker.lease_ms]
    medians: dict[str, list[float]] = {"before": [], "now": []}
    for run in range(repeat):
        times: dict[str, list[float]] = {"before": [], "now": []}
        order = ("before", "now") if run % 2 == 0 else ("now", "before")
        for _ in range(calls):
            for which in order:
                message = TaskMessage(
                    id=uuid.uuid4().hex, task="bench.tasks.noop", queue=QUEUE, enqueued_at=time.time()
                )
                args = [*base, *_enqueue_args(message, 0)]
                t0 = time.perf_counter()
                client.evalsha(shas[which], len(keys), *keys, *args)
                times[which].append((time.perf_counter() - t0) * 1e6)
        for which, values in times.items():
            medians[which].append(statistics.median(values))
        client.delete(qk.msg, qk.state, qk.pending, qk.seq)
    return medians["before"], medians["now"]


#: What a child process runs to time `noop.enqueue()` in the tree on its sys.path (this one, or
#: the one before debounce): the whole enqueue, Python and Redis, of a task without debounce.
ENQUEUE_TIMER = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
import django
django.setup()
from bench import tasks
calls = int(sys.argv[2])
for _ in range(200):
    tasks.noop.enqueue()
t0 = time.perf_counter()
for _ in range(calls):
    tasks.noop.enqueue()
print((time.perf_counter() - t0) / calls * 1e6)
"""


def whole_enqueue_cost(
    redis_url: str, before: str, calls: int, repeat: int
) -> tuple[list[float], list[float]]:
    """µs per `noop.enqueue()` (no debounce) in a process of the tree before and of this one,
    in turns, each on a key prefix of its own."""
    import redis

    client = redis.Redis.from_url(redis_url)
    per_call: dict[str, list[float]] = {"before": [], "now": []}
    with tempfile.TemporaryDirectory() as old_tree:
        archive = subprocess.run(["git", "archive", before], cwd=REPO_ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", old_tree], input=archive.stdout, check=True)
        trees = {"before": old_tree, "now": str(REPO_ROOT)}
        for run in range(repeat):
            for which in ("before", "now") if run % 2 == 0 else ("now", "before"):
                prefix = f"rtqbench-deb-{uuid.uuid4().hex[:8]}"
                env = {**os.environ, "RTQ_REDIS_URL": redis_url, "RTQ_BENCH_PREFIX": prefix}
                env.pop("PYTHONPATH", None)
                out = subprocess.run(
                    [sys.executable, "-c", ENQUEUE_TIMER, trees[which], str(calls)],
                    cwd=trees[which],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                per_call[which].append(float(out.split()[-1]))
                delete_keys(client, f"{prefix}:*")
    client.close()
    return per_call["before"], per_call["now"]


def merge_cost(broker, calls: int, repeat: int) -> list[float]:
    """µs per `TaskType.enqueue()` of a debounced task merged into the copy that waits."""
    from bench import tasks

    qk = broker.queue(QUEUE)
    merged = []
    for _ in range(repeat):
        tasks.debounced_record.using(debounce=600).enqueue("cost", 0)  # the copy that waits
        t0 = time.perf_counter()
        for n in range(calls):
            tasks.debounced_record.using(debounce=600).enqueue("cost", n)
        merged.append((time.perf_counter() - t0) / calls * 1e6)
        delete_keys(broker.client, f"{qk.prefix}*")
    return merged


def bursts(broker, ops, keys: int, burst: int, repeat: int) -> list[tuple[int, int, bool, float]]:
    """Per run: (enqueues in, runs out, every run had its key's last value, seconds enqueueing)."""
    from bench import tasks

    client = broker.client
    worker = start_worker(4, ops)
    results = []
    try:
        for run in range(repeat):
            client.delete(tasks.runs_key())
            t0 = time.perf_counter()
            for n in range(burst):
                for k in range(keys):
                    tasks.debounced_record.enqueue(f"r{run}k{k}", n)
            enqueue_seconds = time.perf_counter() - t0
            deadline = time.monotonic() + RUNS_TIMEOUT
            while client.llen(tasks.runs_key()) < keys and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)  # a window and more: any second run of a key would be out by now
            runs = client.lrange(tasks.runs_key(), 0, -1)
            newest = sorted(runs) == sorted(f"r{run}k{k} {burst - 1}" for k in range(keys))
            results.append((keys * burst, len(runs), newest, enqueue_seconds))
    finally:
        stop_worker(worker)
    return results


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    args = parse_args()
    prefix = f"rtqbench-deb-{uuid.uuid4().hex[:8]}"
    setup_django(args.redis_url, prefix)
    from django_rtq import Operations
    from django_rtq.connection import get_broker

    broker = get_broker()
    client = broker.client
    print(header(client, os.cpu_count() or 1))
    print(ping_line(client, 0.01))
    before = args.before or revision_before_debounce()
    try:
        old, new = script_cost(broker, before, args.calls, args.repeat)
        print(
            f"enqueue script, task without debounce: before ({git('rev-parse', '--short', before).strip()}) "
            f"{median(old):.1f} µs/call, now {median(new):.1f} µs/call "
            f"({(median(new) / median(old) - 1) * 100:+.1f}%; {args.repeat} runs of {args.calls} calls, "
            f"runs {', '.join(f'{v:.1f}' for v in old)} vs {', '.join(f'{v:.1f}' for v in new)})"
        )
        same_claim = script_source("claim", before) == script_source("claim", None)
        print(
            f"claim script: {'the same source as before (nothing to measure)' if same_claim else 'CHANGED'}"
        )
        old, new = whole_enqueue_cost(args.redis_url, before, args.calls, args.repeat)
        print(
            f"noop.enqueue() (Python and Redis), task without debounce: before median {median(old):.1f} µs, "
            f"now median {median(new):.1f} µs ({(median(new) / median(old) - 1) * 100:+.1f}%; {args.repeat} "
            f"runs of {args.calls}, a process each, runs {', '.join(f'{v:.1f}' for v in old)} vs "
            f"{', '.join(f'{v:.1f}' for v in new)})"
        )
        merged = merge_cost(broker, args.calls, args.repeat)
        print(
            f"enqueue() of a debounced task merged into the copy that waits: median {median(merged):.1f} µs "
            f"({args.repeat} runs of {args.calls})"
        )
        results = bursts(broker, Operations(), args.keys, args.burst, args.repeat)
        for enqueued, ran, newest, seconds in results:
            print(
                f"burst: {enqueued} enqueues in ({args.keys} keys x {args.burst}, in {seconds:.2f} s), "
                f"{ran} runs out, each with its key's last arguments: {'yes' if newest else 'NO'}"
            )
        print(
            f"bursts: median {median([r[0] for r in results]):.0f} enqueues in, "
            f"{median([r[1] for r in results]):.0f} runs out over {args.repeat} runs"
        )
    finally:
        delete_keys(client, f"{prefix}:*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

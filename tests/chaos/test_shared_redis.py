"""Issue 24, two Django projects on one Redis: the same database, the default key prefix, so the
same default queue. Each project's worker leaves the other's tasks (types it does not know) for
a worker that can run them, and archives none of them."""

from __future__ import annotations

import statistics
import time
from collections import Counter

import pytest

from django_rtq.broker.keys import Keyspace
from django_rtq.defaults import DEFAULT_IDLE_WAIT_SECONDS, DEFAULT_KEY_PREFIX
from tests.chaos.harness import LIVE_STATES, SITES, report
from tests.chaos.in_flight import SLACK_SECONDS
from tests.support.polling import wait_for

pytestmark = pytest.mark.chaos

PROJECTS = ("north", "south")
#: Tasks each project enqueues.
TASKS = 200
#: Seconds between two enqueues of one project's web: the two webs interleave.
INTERVAL = 0.01
#: Each project's runs: 0.2-0.5 s (chaosapp/ledger.py's stream), 0.35 s on average, on the 10
#: threads of its one worker (rtq_worker's default).
MEAN_RUN_SECONDS = 0.35
THREADS = 10
#: Seconds from the first run until the queue is drained: each worker's runs, as if the other
#: project's tasks cost it nothing, and an idle wait; what leaving them costs must fit in the slack.
DRAIN_LIMIT = TASKS * MEAN_RUN_SECONDS / THREADS + DEFAULT_IDLE_WAIT_SECONDS + SLACK_SECONDS  # 10 s


@pytest.mark.timeout(180)
def test_two_projects_share_redis(redis_servers, chaos_project):
    """Two projects (their own settings, secret keys and task modules), a worker each, 200 + 200
    tasks enqueued at the same time into the one default queue: each ran once, on its own
    project's worker, none archived."""
    server = redis_servers()
    projects = {
        name: chaos_project(
            server.url,
            directory=name,
            settings=f"{name}site.settings",
            path=SITES / name,
            key_prefix=DEFAULT_KEY_PREFIX,
        )
        for name in PROJECTS
    }
    workers = {name: project.start_worker(name=name) for name, project in projects.items()}
    workers_key = Keyspace(DEFAULT_KEY_PREFIX).workers
    any_project = projects["north"]
    wait_for(
        lambda: any_project.client.zcard(workers_key) == len(PROJECTS),
        timeout=30,
        message="both projects' workers to start",
    )

    started = time.time()
    for name, project in projects.items():
        calls = [(f"{name}{i}", f"{name}app.tasks.ship", [i], {}) for i in range(TASKS)]
        project.call(calls, name="web", interval=INTERVAL)
    most_parked = 0

    def drained() -> bool:
        nonlocal most_parked
        most_parked = max(most_parked, any_project.client.zcard(any_project.keys.parked))
        sizes = any_project.sizes()
        done = all(project.clients_done() for project in projects.values())
        return done and sizes is not None and not any(sizes[state] for state in LIVE_STATES)

    drained_at = time.time() if wait_for(drained, 3 * DRAIN_LIMIT, interval=0.05, fail=False) else None

    acked = {key: task_id for project in projects.values() for key, task_id in project.acknowledged().items()}
    ledger = any_project.ledger()
    runs = Counter(entry["key"] for entry in ledger)
    lost = sorted(key for key in acked if not runs[key])
    twice = sorted(key for key, count in runs.items() if count > 1)
    foreign = [
        (entry["key"], entry["ran_by"], entry["pid"])
        for entry in ledger
        if not entry["key"].startswith(entry["ran_by"]) or entry["pid"] != workers[entry["ran_by"]].pid
    ]
    charged = [
        entry["key"] for entry in ledger if entry["retried"] or entry["recovered"] or entry["requeued"]
    ]
    claims = [entry["claims"] for entry in ledger]
    # What each worker says it left for another: `leaving N task(s) of type '<other>app.tasks.ship'`.
    left = {
        name: sum(
            f"of type '{other}app.tasks.ship'" in line
            for line in workers[name].log.read_text().splitlines()
            if "leaving" in line
            for other in PROJECTS
            if other != name
        )
        for name in PROJECTS
    }
    sizes = any_project.sizes() or {}
    drain = "never" if drained_at is None else f"{drained_at - started:.1f}s"
    # The clients take a while to start: the work begins with the first run.
    starts = [run.start for project in projects.values() for run in project.runlog.refresh().runs]
    first_run = min(starts, default=started)
    report(
        f"chaos shared-redis: tasks={len(acked)} refused={sum(p.refused() for p in projects.values())} "
        f"lost={len(lost)} reruns={len(twice)} foreign_runs={len(foreign)} charged={len(charged)} "
        f"archived={sizes.get('archived', '?')} most_parked={most_parked} "
        f"leaving_logged={','.join(f'{name}:{count}' for name, count in left.items())} "
        f"claims_per_task=max:{max(claims, default=0)},mean:{statistics.fmean(claims or [0]):.2f} "
        f"time_to_drain={drain} drain_after_first_run="
        f"{'never' if drained_at is None else f'{drained_at - first_run:.1f}s'},bound:{DRAIN_LIMIT:.1f}s"
    )
    problems = []
    if len(acked) != TASKS * len(PROJECTS):
        problems.append(f"{len(acked)} enqueues acknowledged of {TASKS * len(PROJECTS)}")
    if lost:
        problems.append(f"{len(lost)} task(s) never ran: {lost[:5]}")
    if twice:
        problems.append(f"{len(twice)} task(s) ran more than once: {twice[:5]}")
    if foreign:
        problems.append(f"{len(foreign)} task(s) ran outside their project's worker: {foreign[:5]}")
    if charged:
        problems.append(f"{len(charged)} task(s) were charged an attempt or taken back: {charged[:5]}")
    if drained_at is None:
        problems.append(f"the queue was never drained: {sizes}")
    elif drained_at - first_run > DRAIN_LIMIT:
        problems.append(f"drained {drained_at - first_run:.1f}s after the first run, over {DRAIN_LIMIT:.1f}s")
    if sizes.get("archived"):
        problems.append(f"{sizes['archived']} task(s) archived")
    if not any(left.values()):
        problems.append("no worker said it left the other project's tasks: the scenario did not happen")
    if problems:
        for worker in workers.values():
            print(f"--- tail of worker {worker.name} (pid {worker.pid}):\n{worker.tail()}")
        pytest.fail("chaos shared-redis: " + "; ".join(problems), pytrace=False)

"""The transactional outbox with real worker processes, on SQLite and on PostgreSQL.

While Redis is down, requests through Django's handler each commit an order and
`enqueue_on_commit` its receipt (`chaos_receipt`, a django-rtq task): every one answers 200,
and the outbox holds one row per commit; a request that fails after its enqueue rolls back
and leaves neither an order nor a row. Once Redis is back, the workers' relays send the rows:

- outage: one worker runs every committed task exactly once, and no rolled-back one;
- two relays: two workers started at once relay the same rows, and no task is made twice;
- SIGKILL mid-relay: a worker is killed as its relay's second batch reaches Redis (its rows
  sent, not yet deleted), then a second worker as its relay holds a batch it has not sent; a
  third sends the rest, and the rows the killed ones held once their lease ran out: nothing is
  lost, and no task is made twice;
- Django's own `@task`: `enqueue()` in a transaction, with the backend's OUTBOX option.

Each scenario prints a figures line. `requests_per_s` is the pace of the requests while Redis
is down: a process that found Redis away leaves its rows to the relay for a while
(PAUSE_AFTER_OUTAGE), so only the first request then waits on the Redis client
(`slowest_request`).
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

import pytest

from django_rtq.defaults import (
    DEFAULT_OUTBOX_RELAY_AFTER_SECONDS,
    DEFAULT_OUTBOX_RELAY_INTERVAL_SECONDS,
    DEFAULT_RECOVERER_INTERVAL_SECONDS,
)
from django_rtq.outbox import LEASE_SECONDS, RELAY_BATCH
from tests.chaos.harness import DATABASES, Chaos, Redis, Run, Worker
from tests.chaos.in_flight import (
    RECOVERER_SETTLE_SECONDS,
    RERUN_SECONDS,
    SLACK_SECONDS,
    cut_by_kills,
    rerun_delays,
    wait_ready,
)
from tests.support.polling import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.parametrize("database", DATABASES)]

#: How long a task's handler sleeps (ms): long enough for a kill to land mid-run.
TASK_MS = 5
#: Seconds a worker gets to start, relay up to 5,000 rows and run their tasks, on a loaded machine.
WORK_SECONDS = 10.0
#: Seconds the relays and workers get to run every committed task once Redis is back: the rows
#: stored last are due OUTBOX_RELAY_AFTER after they were, and a relay looks every interval.
RUN_WAIT_SECONDS = DEFAULT_OUTBOX_RELAY_AFTER_SECONDS + DEFAULT_OUTBOX_RELAY_INTERVAL_SECONDS + WORK_SECONDS
#: Once every relay that held rows was killed, the rows they held are taken again once their
#: lease lapsed, at the next relay pass; a batch then to send and run.
BATCH_SECONDS = 2.0
KILLED_RELAY_SECONDS = LEASE_SECONDS + DEFAULT_OUTBOX_RELAY_INTERVAL_SECONDS + BATCH_SECONDS + SLACK_SECONDS
#: Seconds the outbox gets to be emptied, and the queue to be drained, once every task ran.
SETTLE_WAIT_SECONDS = 10.0
#: A run that ended this shortly before its process was SIGKILLed may not have been settled in
#: Redis: its task runs again after its lease, as after a run the kill cut. (Such runs were
#: seen to end 3 to 12 ms before the kill; the margin is for a loaded machine.)
UNSETTLED_SECONDS = 1.0
#: What a relay logs for each batch whose tasks it wrote to Redis.
RELAYED = re.compile(r"relayed (\d+) task\(s\) from the outbox")


def order_calls(commits: int, *, rollback_every: int = 0, ms: int = TASK_MS) -> list[tuple[str, int, bool]]:
    """`commits` requests that commit (keys c0, c1...) and, after every `rollback_every`-th,
    one that fails after its enqueue and rolls back (r<n>): for `Chaos.orders`."""
    calls = []
    for n in range(commits):
        calls.append((f"c{n}", ms, True))
        if rollback_every and (n + 1) % rollback_every == 0:
            calls.append((f"r{n}", ms, False))
    return calls


def keys_of(calls: list[tuple[str, int, bool]], *, commits: bool) -> list[str]:
    return [key for key, _, committing in calls if committing == commits]


def assert_same_keys(found: Iterable[str], expected: Iterable[str], what: str) -> None:
    found, expected = Counter(list(found)), Counter(list(expected))
    missing, extra = expected - found, found - expected
    assert not missing and not extra, (
        f"{what}: {missing.total()} missing (e.g. {sorted(missing)[:5]}), "
        f"{extra.total()} unexpected or repeated (e.g. {sorted(extra)[:5]})"
    )


def held_at(condition: Callable[[], bool], timeout: float) -> float | None:
    """When (time.time()) `condition` held, polled for up to `timeout` seconds; None if it did
    not (nothing fails: the scenario's checks report it)."""
    return time.time() if wait_for(condition, timeout, interval=0.05, fail=False) else None


def orders_while_redis_is_down(chaos: Chaos, server: Redis, calls, *, django_task: bool = False) -> str:
    """Take Redis down, make the requests, and check what they left: each committing request
    answered 200 and left its order and one outbox row; each other left neither. Return the
    figures of the requests."""
    server.down()
    chaos.orders(calls, django_task=django_task)
    chaos.wait_clients(timeout=120)
    committed, rolled_back = keys_of(calls, commits=True), keys_of(calls, commits=False)
    assert chaos.refused() == 0, "requests answered neither 200 (commit) nor 500 (rollback)"
    assert_same_keys(chaos.acknowledged(), committed, "requests that committed and answered 200")
    assert_same_keys(chaos.rolled_back(), rolled_back, "requests that rolled back (500)")
    assert_same_keys(chaos.order_keys(), committed, "orders while Redis is down")
    assert_same_keys(chaos.outbox_keys(), committed, "outbox rows while Redis is down")
    seconds, slowest = chaos.request_seconds()
    return (
        f"requests={len(calls)} committed={len(committed)} rolled_back={len(rolled_back)} "
        f"rows_while_down={chaos.outbox_count()} requests_per_s={len(calls) / seconds:.0f} "
        f"slowest_request={slowest:.3f}s"
    )


def wait_relayed(
    chaos: Chaos, calls, *, since: float, run_wait: float = RUN_WAIT_SECONDS
) -> tuple[str, list[str], float | None]:
    """Wait up to `run_wait` seconds until every committed task ran, then until the outbox is
    empty and the queue drained; return the figures, the problems (a rolled-back task ran, rows
    were left, a task settled twice) and when the queue was drained (None if it was not)."""
    ran_at = chaos.wait_ran(keys_of(calls, commits=True), run_wait)
    # Every task may have run while rows a killed relay held, already sent, wait out its lease.
    emptied_at = held_at(lambda: chaos.outbox_count() == 0, LEASE_SECONDS + SETTLE_WAIT_SECONDS)
    drained_at = chaos.wait_drained(SETTLE_WAIT_SECONDS) if ran_at is not None else None
    left = chaos.outbox_count()
    started = chaos.runlog.refresh().started
    ran_rolled_back = sum(1 for key in keys_of(calls, commits=False) if started[key])
    committed, settled = len(keys_of(calls, commits=True)), chaos.settled()
    figures = (
        f"ran_rolled_back={ran_rolled_back} outbox_left={left} settled={settled} "
        f"relay_drain={seconds_since(since, ran_at)} outbox_emptied={seconds_since(since, emptied_at)}"
    )
    problems = []
    if ran_rolled_back:
        problems.append(f"{ran_rolled_back} task(s) of rolled-back requests ran")
    if left:
        problems.append(f"{left} row(s) left in the outbox")
    if drained_at is not None and settled != committed:
        # Each task is settled once, however often a kill cut its runs: more is a task made twice.
        problems.append(f"Redis settled {settled} runs of {committed} tasks")
    return figures, problems, drained_at


def seconds_since(start: float, when: float | None) -> str:
    return "never" if when is None else f"{when - start:.1f}s"


def ran_more_than_once(chaos: Chaos, calls) -> list[str]:
    started = chaos.runlog.refresh().started
    reran = [key for key in keys_of(calls, commits=True) if started[key] > 1]
    return [f"{len(reran)} task(s) ran more than once, e.g. {reran[:5]}"] if reran else []


def relayed_by(workers: list[Worker]) -> str:
    """How many tasks each worker's relay wrote to Redis (from its log), as `name:count,...`."""
    counts = {w.name: sum(map(int, RELAYED.findall(w.log.read_text(errors="replace")))) for w in workers}
    return ",".join(f"{name}:{count}" for name, count in counts.items())


def remade(chaos: Chaos, keys: list[str]) -> list[str]:
    """The keys that ran more than once though no kill explains it: none of their runs but the
    last was cut by a kill, or ended so shortly before one that its outcome may not have reached
    Redis. A task made twice (a row sent again written again) shows as such a key."""
    deaths = dict(chaos.kills)
    runs: dict[str, list[Run]] = defaultdict(list)
    for run in chaos.runlog.refresh().runs + chaos.runlog.unended():
        runs[run.key].append(run)

    def killed_with(run: Run) -> bool:
        died = deaths.get(run.pid)
        return died is not None and (run.end is None or died - run.end < UNSETTLED_SECONDS)

    found = []
    for key in keys:
        earlier = sorted(runs[key], key=lambda run: run.start)[:-1]
        if earlier and not any(killed_with(run) for run in earlier):
            found.append(key)
    return found


#: Victims `kill_once_sent` starts at most, for a kill that cuts a relay between its send and its
#: delete: the poll that times the kill can come late on a loaded machine.
SENT_KILL_ATTEMPTS = 3


def kill_once_sent(chaos: Chaos, name: str) -> tuple[int, int]:
    """Start a worker and SIGKILL it as soon as its relay has sent a second batch to Redis
    (polled every millisecond): most times, before it deleted those rows. When the kill came
    after the delete (nothing sent is held), start another and try again, SENT_KILL_ATTEMPTS
    times at most. Return what `held_at_kill` does at the last kill."""
    for attempt in range(SENT_KILL_ATTEMPTS):
        worker = chaos.start_worker(name=f"{name}-{attempt}" if attempt else name)
        sent = chaos.client.zcard(chaos.keys.outboxed)
        wait_for(
            lambda sent=sent: chaos.client.zcard(chaos.keys.outboxed) > sent + RELAY_BATCH,
            timeout=30,
            interval=0.001,
            message=f"worker {worker.name} to send two batches",
        )
        chaos.kill(worker.pid)
        held, sent_of_held = held_at_kill(chaos)
        if held and sent_of_held:
            break
    return held, sent_of_held


def kill_once_leased(chaos: Chaos, worker: Worker) -> tuple[int, int]:
    """SIGKILL `worker` once its relay has deleted a batch it sent and holds the next one (polled
    every few ms): most times, before it sent that one. Return what `held_at_kill` does."""
    rows, held = chaos.outbox_count(), chaos.outbox_count(leased=True)
    wait_for(
        lambda: chaos.outbox_count() < rows and chaos.outbox_count(leased=True) > held,
        timeout=30,
        interval=0.002,
        message=f"worker {worker.name} to relay a batch and take the next",
    )
    chaos.kill(worker.pid)
    return held_at_kill(chaos)


def held_at_kill(chaos: Chaos) -> tuple[int, int]:
    """How many rows relays hold (leased), and how many of those the outbox sent to Redis
    already: the rows another relay sends again once their lease ran out."""
    leased = chaos.outbox_task_ids(leased=True)
    return len(leased), chaos.outboxed(leased)


@pytest.mark.timeout(150)
def test_requests_while_redis_is_down_run_once_when_it_is_back(database, redis_servers, chaos_project):
    """1,000 requests commit and 100 roll back while Redis is down; Redis back, one worker."""
    server = redis_servers()
    chaos = chaos_project(server.url, database=database)
    calls = order_calls(1000, rollback_every=10)
    while_down = orders_while_redis_is_down(chaos, server, calls)

    server.up()
    back = time.time()
    chaos.start_worker(name="relay")
    figures, problems, drained_at = wait_relayed(chaos, calls, since=back)
    chaos.verify(
        f"outbox-outage[{database}]",
        f"{while_down} {figures}",
        last_fault=back,
        drained_at=drained_at,
        drain_limit=RUN_WAIT_SECONDS,
        problems=problems + ran_more_than_once(chaos, calls),
    )


@pytest.mark.timeout(150)
def test_two_relays_on_the_same_rows_make_each_task_once(database, redis_servers, chaos_project):
    """2,000 requests commit while Redis is down; Redis back, two workers started at once."""
    server = redis_servers()
    chaos = chaos_project(server.url, database=database)
    calls = order_calls(2000)
    while_down = orders_while_redis_is_down(chaos, server, calls)

    server.up()
    back = time.time()
    workers = [chaos.start_worker(name=f"relay{slot}") for slot in range(2)]
    figures, problems, drained_at = wait_relayed(chaos, calls, since=back)
    chaos.verify(
        f"outbox-two-relays[{database}]",
        f"{while_down} relayed_by={relayed_by(workers)} {figures}",
        last_fault=back,
        drained_at=drained_at,
        drain_limit=RUN_WAIT_SECONDS,
        problems=problems + ran_more_than_once(chaos, calls),
    )


@pytest.mark.timeout(200)
def test_relays_sigkilled_mid_relay_lose_nothing_and_make_nothing_twice(
    database, redis_servers, chaos_project
):
    """5,000 requests commit while Redis is down (one request each); Redis back, a worker
    SIGKILLed mid-relay as its second batch reaches Redis, then a second as it holds a batch
    after deleting one; a third relays the rest, and the rows the killed ones held once their
    lease ran out: sent again, or for the first time."""
    server = redis_servers()
    chaos = chaos_project(server.url, database=database)
    calls = order_calls(5000)
    while_down = orders_while_redis_is_down(chaos, server, calls)

    server.up()
    back = time.time()
    held = [kill_once_sent(chaos, "victim0")]
    held.append(kill_once_leased(chaos, chaos.start_worker(name="victim1")))
    last_kill = chaos.kills[-1][1]
    ready_at = wait_ready(chaos.start_worker(name="survivor"))
    figures, problems, drained_at = wait_relayed(
        chaos, calls, since=back, run_wait=KILLED_RELAY_SECONDS + RUN_WAIT_SECONDS
    )

    twice = remade(chaos, keys_of(calls, commits=True))
    if twice:
        problems.append(f"{len(twice)} task(s) ran again with no kill to explain it, e.g. {twice[:5]}")
    ended_twice = sum(1 for count in chaos.runlog.ended.values() if count > 1)
    # What each kill cut: the rows its relay held (the first kill's stay leased past the second),
    # of them those already in Redis, and the runs its worker had going.
    (held0, sent0), (held1, sent1) = held[0], (held[1][0] - held[0][0], held[1][1] - held[0][1])
    if not (held0 and sent0):
        problems.append(f"the first kill did not cut a relay between sending and deleting: {held[0]}")
    if not held1:
        problems.append(f"the second kill did not cut a relay holding rows: {held}")
    # The tasks of the runs the kills cut are recovered by the survivor: a lease past the kill,
    # and a lease and a heartbeat past its start (RECOVERER_SETTLE_SECONDS).
    rerun_by = (
        max(
            last_kill + RERUN_SECONDS,
            ready_at + RECOVERER_SETTLE_SECONDS + DEFAULT_RECOVERER_INTERVAL_SECONDS,
        )
        + SLACK_SECONDS
    )
    delays = rerun_delays(chaos)
    reruns = [delay + when for delay, when in zip(delays, cut_times(chaos), strict=True) if delay is not None]
    if len(reruns) < len(delays) or max(reruns, default=0) > rerun_by:
        problems.append(
            f"runs the kills cut ran again {max(reruns, default=0) - last_kill:.1f}s after the last kill, "
            f"over {rerun_by - last_kill:.1f}s (or never: {len(delays) - len(reruns)})"
        )
    chaos.verify(
        f"outbox-sigkill-relay[{database}]",
        f"{while_down} kills={len(chaos.kills)} held_per_kill={held0},{held1} sent_of_held={sent0},{sent1} "
        f"runs_cut_per_kill={','.join(map(str, cut_by_kills(chaos)))} "
        f"rerun_after_last_kill=max:{max(reruns, default=last_kill) - last_kill:.1f}s,"
        f"bound:{rerun_by - last_kill:.1f}s "
        f"remade={len(twice)} ended_twice={ended_twice} {figures}",
        last_fault=last_kill,
        drained_at=drained_at,
        drain_limit=KILLED_RELAY_SECONDS,
        problems=problems,
    )


def cut_times(chaos: Chaos) -> list[float]:
    """When the process of each run a kill cut died, in the order of `rerun_delays`."""
    deaths = dict(chaos.kills)
    return [deaths[run.pid] for run in chaos.runlog.unended() if run.pid in deaths]


@pytest.mark.timeout(150)
def test_django_tasks_enqueued_in_a_transaction_survive_redis_being_down(
    database, redis_servers, chaos_project
):
    """Django's own API: `chaos_sleep.enqueue()` in the request's transaction, with the
    backend's OUTBOX option; 200 requests commit and 20 roll back while Redis is down."""
    server = redis_servers()
    chaos = chaos_project(server.url, database=database, tasks_outbox=True)
    calls = order_calls(200, rollback_every=10)
    while_down = orders_while_redis_is_down(chaos, server, calls, django_task=True)

    server.up()
    back = time.time()
    chaos.start_worker(name="relay")
    figures, problems, drained_at = wait_relayed(chaos, calls, since=back)
    chaos.verify(
        f"outbox-django-task[{database}]",
        f"{while_down} {figures}",
        last_fault=back,
        drained_at=drained_at,
        drain_limit=RUN_WAIT_SECONDS,
        check_results=True,
        problems=problems + ran_more_than_once(chaos, calls),
    )

"""Redis up but refusing writes under working workers: full (`OOM`) or a replica (`READONLY`).

Two workers (django-rtq's defaults) on 120 tasks of 1.4 s; once 20 handlers run, their Redis
refuses every write for 8 s (longer than the lease budget, 4 s) while a client enqueues 20
tasks with a plain `enqueue()` and 20 requests each commit an order and `enqueue_on_commit()`
its receipt (the transactional outbox); then it takes writes again. Nothing acknowledged is
lost, no two runs of a task overlap, no handler runs to its end twice (a result refused waits
in the worker and is written later), and the plain enqueues are refused with
`BrokerUnavailable` (docs/reliability.md) while the orders' tasks wait in the outbox.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
import redis

from tests.chaos.harness import Chaos
from tests.support.polling import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

TASKS = 120
#: Not a divisor of the lease budget (4 s): the tasks a worker claimed together run in waves
#: from the claim, the budget runs from it too (no renewal gets through), and a wave ending at
#: the budget would race its stop by microseconds: a handler that ran to its end and was then
#: stopped runs again, which no design can tell from one stopped just before its end.
TASK_MS = 1400
#: How long Redis refuses writes: past the lease budget (4 s at the defaults).
REFUSING_SECONDS = 8.0
#: Once Redis takes writes: the results kept are written, the rest of the 160 tasks of 1.4 s run
#: on 20 threads, and tasks whose handlers were stopped wait one lease of unbroken contact.
DRAIN_LIMIT = 20.0
#: Memory of the full Redis, and the size of the key that fills it past that.
MAXMEMORY = 32 * 1024 * 1024
FILLER_BYTES = 48 * 1024 * 1024


def refusals(chaos: Chaos) -> Counter[str]:
    """The errors the clients' refused calls raised, by class name (the `fail <key> <error>` lines)."""
    lines = [line.split() for _, out in chaos.clients for line in out.read_text().splitlines()]
    return Counter(parts[2] for parts in lines if parts[0] == "fail")


def run_refusing(chaos: Chaos, scenario: str, refuse: Callable[[], None], allow: Callable[[], None]) -> None:
    """Start the workers on TASKS tasks, `refuse` writes once 20 handlers run, enqueue
    meanwhile, `allow` writes again after REFUSING_SECONDS; check and report."""
    chaos.enqueue([(f"a{i}", TASK_MS) for i in range(TASKS)], batch=TASKS, name="before")
    chaos.wait_clients(timeout=60)
    for slot in range(2):
        chaos.start_worker(name=f"w{slot}")
    chaos.wait_started(20)

    refused_at = time.time()
    refuse()
    chaos.enqueue([(f"p{i}", TASK_MS) for i in range(20)], interval=0.2, name="plain")
    chaos.orders([(f"o{i}", TASK_MS, True) for i in range(20)])
    chaos.wait_clients(timeout=REFUSING_SECONDS)
    outboxed = chaos.outbox_count()
    time.sleep(max(0.0, refused_at + REFUSING_SECONDS - time.time()))  # the fault itself
    allow()
    allowed_at = time.time()

    drained_at = chaos.wait_drained(90)
    running = chaos.running_at(refused_at)
    errors = refusals(chaos)
    ended_twice = sorted(key for key, n in chaos.runlog.refresh().ended.items() if n > 1)
    problems = []
    if running < 20:
        problems.append(f"the fault caught {running} handlers running, not 20")
    if set(errors) != {"BrokerUnavailable"} or errors["BrokerUnavailable"] != 20:
        problems.append(f"the plain enqueues were not all refused with BrokerUnavailable: {dict(errors)}")
    if outboxed != 20:
        problems.append(f"{outboxed} orders' tasks waited in the outbox, not 20")
    if ended_twice:
        problems.append(f"{len(ended_twice)} handler(s) ran to their end twice, e.g. {ended_twice[:5]}")
    chaos.verify(
        scenario,
        f"refusing_writes={REFUSING_SECONDS:.0f}s runs_at_fault={running} outboxed={outboxed} "
        f"ended_twice={len(ended_twice)}",
        last_fault=allowed_at,
        drained_at=drained_at,
        drain_limit=DRAIN_LIMIT,
        problems=problems,
    )


def test_redis_full_mid_run(redis_servers, chaos_project):
    """Redis reaches `maxmemory` (`noeviction`) mid-run: a big key fills it; then it gets memory
    back (`CONFIG SET maxmemory 0`)."""
    server = redis_servers("--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction")
    chaos = chaos_project(server.url)
    admin = redis.Redis(port=server.port, decode_responses=True)

    def refuse() -> None:
        admin.setrange("filler", FILLER_BYTES, "x")  # a write allowed while under the limit
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # the fault is real
            admin.set("probe", "1")

    try:
        run_refusing(chaos, "redis-full", refuse, lambda: admin.config_set("maxmemory", 0))
    finally:
        admin.close()


def test_redis_turned_replica_mid_run(redis_servers, chaos_project):
    """The workers' Redis becomes a replica mid-run (`FAILOVER` to its replica: what a worker
    whose DNS name still points at the old master meets after a failover: `READONLY`); then
    it is the master again (`REPLICAOF NO ONE`). Nothing uses the other server meanwhile."""
    master = redis_servers()
    replica = redis_servers("--replicaof", "127.0.0.1", str(master.port))
    chaos = chaos_project(master.url)
    old = redis.Redis(port=master.port, decode_responses=True)
    new = redis.Redis(port=replica.port, decode_responses=True)

    def role(client: redis.Redis) -> str:
        return client.info("replication")["role"]

    def refuse() -> None:
        wait_for(lambda: old.info("replication").get("connected_slaves") == 1, message="the replica")
        old.execute_command("FAILOVER")  # coordinated: it waits for the replica to catch up
        wait_for(lambda: role(old) == "slave" and role(new) == "master", message="the roles to swap")
        with pytest.raises(redis.exceptions.ReadOnlyError):  # the fault is real
            old.set("probe", "1")

    def allow() -> None:
        old.execute_command("REPLICAOF", "NO", "ONE")
        new.execute_command("REPLICAOF", "127.0.0.1", str(master.port))

    try:
        run_refusing(chaos, "redis-read-only", refuse, allow)
    finally:
        old.close()
        new.close()

"""Redis faults that lose writes (a failover of asynchronous replication, a restart from an
append-only file fsynced every second): pointing a scenario at Sentinel or a Cluster, and the
checks of what still holds."""

from __future__ import annotations

import pytest
import redis

from tests.chaos.harness import Chaos, report
from tests.support.polling import wait_for

# Redis faults that lose writes (a failover of asynchronous replication, a restart from an
# append-only file fsynced every second): the checks of what still holds.


def point_at(chaos: Chaos, url: str) -> None:
    """Have the project's processes and the checks use `url` (a Sentinel or Cluster URL, which
    the `Chaos` it was made with a plain URL of cannot read itself)."""
    from django_rtq.connection import redis_client

    chaos.client.close()
    chaos.redis_url = chaos.worker_url = url
    chaos.client = redis_client(url, socket_timeout=5)


def acknowledged_by(chaos: Chaos, replica: redis.Redis, master: redis.Redis) -> set[str]:
    """The keys acknowledged so far, once `replica` has everything `master` had when they were
    read (its replication offset caught up): writes that survive the master's loss."""
    keys = set(chaos.acknowledged())
    offset = int(master.info("replication")["master_repl_offset"])
    wait_for(
        lambda: int(replica.info("replication").get("slave_repl_offset", -1)) >= offset,
        10,
        interval=0.01,
        message="the replica to catch up with the keys acknowledged",
    )
    return keys


def verify_lossy(
    chaos: Chaos,
    scenario: str,
    faults: str,
    *,
    fault_at: float,
    kept: set[str],
    drained_at: float | None,
    drain_limit: float | None = None,
    problems: list[str] | None = None,
) -> dict[str, int]:
    """Print the figures of a fault that may lose Redis's latest writes (at `fault_at`), and fail
    unless what still holds does: no task of `kept` (acknowledged before the writes that could
    be lost) is lost; every overlap pairs a run that started before the fault (its claim undone
    with the lost writes) with one after it; the queue drained (within `drain_limit` of the
    fault); nothing archived. Return the figures: `lost` (acknowledged enqueues lost),
    `ended_twice` (tasks whose handler ran to its end twice: a completion lost), `overlapping`."""
    chaos.runlog.refresh()
    acked = chaos.acknowledged()
    lost = sorted(key for key in acked if not chaos.runlog.ended[key])
    lost_kept = [key for key in lost if key in kept]
    overlaps = chaos.overlaps()
    late = [(a, b) for a, b in overlaps if min(a.start, b.start) >= fault_at]
    sizes = chaos.sizes() or {}
    figures = {
        "lost": len(lost),
        "lost_of_kept": len(lost_kept),
        "ended_twice": sum(1 for key in acked if chaos.runlog.ended[key] > 1),
        "overlapping": len(overlaps),
        "reruns": sum(1 for key in acked if chaos.runlog.started[key] > 1),
    }
    drain = "never" if drained_at is None else f"{max(0.0, drained_at - fault_at):.1f}s"
    report(
        f"chaos {scenario}: tasks={len(acked)} refused_enqueues={chaos.refused()} {faults} "
        f"acked_after_last_safe_point={len(set(acked) - kept)} "
        + " ".join(f"{name}={value}" for name, value in figures.items())
        + f" runs_aborted={chaos.runlog.aborted} archived={sizes.get('archived', '?')} "
        f"drain_after_fault={drain}"
    )
    problems = list(problems or [])
    if lost_kept:
        problems.append(f"{len(lost_kept)} task(s) acknowledged before the last safe point never ended")
    if late:
        problems.append(f"{len(late)} pair(s) of runs started after the fault overlapped")
    if drained_at is None:
        problems.append(f"the queue was never drained: {sizes}")
    elif drain_limit is not None and drained_at - fault_at > drain_limit:
        problems.append(f"drained {drained_at - fault_at:.1f}s after the fault, over {drain_limit}s")
    if sizes.get("archived"):
        problems.append(f"{sizes['archived']} task(s) archived")
    if problems:
        chaos.diagnose(lost_kept, late, None)
        pytest.fail(f"chaos {scenario}: " + "; ".join(problems), pytrace=False)
    return figures

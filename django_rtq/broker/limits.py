"""Flow control: the rate and concurrency limits of task types and queues, as the claim applies them.

A limit belongs to a *scope*: a task type (its name) or a whole queue (`QUEUE_SCOPE`). The
claim script (claim.lua) receives a queue's limits as JSON with every claim, so limits changed
by a deploy apply from the first claim of its workers, and nothing about them is kept in Redis
but their use: a token bucket per rate limit, a count of slots per concurrency limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

#: The scope of a queue's own limits, which every task of the queue counts against.
QUEUE_SCOPE = "*"
#: Joins a task type's name and a partition's into the scope of that partition's limits,
#: "<task>\2<partition>"; "<task>\2" alone is the scope of the limits each partition of the type
#: has (claim.lua; docs/partitions.md).
PARTITION_SEPARATOR = "\2"
#: Added to the pending score of a task held back by its type's limits, so that it sorts after
#: every task that can run (claim.lua). The same as HELD_BASE in _lib.lua (a test checks).
HELD_BASE = 4_000_000_000_000_000
#: Periods a rate limit may name.
PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
RATE_PATTERN = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")
#: A bucket as claim.lua stores it: "<tokens>:<updated at, ms>".
BUCKET_PATTERN = re.compile(r"(\d+\.?\d*):(\d+)")


@dataclass(frozen=True, slots=True)
class Limit:
    """The limits of one scope: at most `rate` starts per `period` seconds (with a bucket of
    `burst` starts), and at most `max_concurrency` running at once. None is no limit."""

    rate: int | None = None
    period: float = 1.0
    burst: int = 1
    max_concurrency: int | None = None

    def as_spec(self) -> dict[str, float]:
        """The limit as claim.lua reads it: r starts per p ms, bucket b; c running."""
        spec: dict[str, float] = {}
        if self.rate is not None:
            spec.update(r=self.rate, p=int(self.period * 1000), b=self.burst)
        if self.max_concurrency is not None:
            spec["c"] = self.max_concurrency
        return spec

    @property
    def rate_limit(self) -> str | None:
        """The rate as it was written: "20/s"."""
        if self.rate is None:
            return None
        unit = next(name for name, seconds in PERIODS.items() if seconds == self.period)
        return f"{self.rate}/{unit}"

    def describe(self) -> str:
        """For people: "20/s (burst 40), at most 3 running"."""
        parts = []
        if self.rate is not None:
            parts.append(f"{self.rate_limit}" + (f" (burst {self.burst})" if self.burst > 1 else ""))
        if self.max_concurrency is not None:
            parts.append(f"at most {self.max_concurrency} running")
        return ", ".join(parts)


def make_limit(
    *, rate_limit: Any = None, burst: Any = None, max_concurrency: Any = None, where: str
) -> Limit | None:
    """Validate limits as a user writes them (`rate_limit="20/s", burst=40, max_concurrency=3`);
    None when there are none. Raises ValueError naming `where` and the fix."""
    rate, period = None, 1.0
    if rate_limit is not None:
        match = RATE_PATTERN.fullmatch(rate_limit) if isinstance(rate_limit, str) else None
        if match is None or int(match[1]) < 1:
            raise ValueError(
                f"{where}: rate_limit must be a string like '20/s', '100/m' or '1000/h' (a positive "
                f"whole number of starts per second, minute or hour), not {rate_limit!r}."
            )
        rate, period = int(match[1]), PERIODS[match[2]]
    if burst is not None:
        if rate is None:
            raise ValueError(f"{where}: burst needs a rate_limit to apply to.")
        if not _is_positive_int(burst):
            raise ValueError(f"{where}: burst must be a positive whole number of starts, not {burst!r}.")
    if max_concurrency is not None and not _is_positive_int(max_concurrency):
        raise ValueError(
            f"{where}: max_concurrency must be a positive whole number of tasks, not {max_concurrency!r}."
        )
    if rate is None and max_concurrency is None:
        return None
    return Limit(rate=rate, period=period, burst=burst or 1, max_concurrency=max_concurrency)


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True, slots=True)
class PartitionLimits:
    """A task type's limits for its partitions: those each partition has (`each`), and those of
    partitions it names (`named`: a premium tier, say), which take their place."""

    each: Limit | None = None
    named: Mapping[str, Limit] = field(default_factory=dict)

    def for_partition(self, partition: str) -> Limit | None:
        return self.named.get(partition, self.each)


def partition_scope(task: str, partition: str = "") -> str:
    """The scope of a partition's limits ("" for the limits each partition has)."""
    return f"{task}{PARTITION_SEPARATOR}{partition}"


def split_scope(scope: str) -> tuple[str | None, str | None]:
    """A scope's task type and partition: (None, None) for the queue's own, (task, None) for a
    type's, (task, partition) for a partition's, (task, "") for the limits each partition has."""
    if scope == QUEUE_SCOPE:
        return None, None
    task, separator, partition = scope.partition(PARTITION_SEPARATOR)
    return task, (partition if separator else None)


def scope_label(scope: str, name: Callable[[str], str] = str) -> str:
    """A scope for people, the same on every surface: "whole queue", "crm.tasks.sync",
    "crm.tasks.sync · partition acme", "crm.tasks.sync · each partition"; `name` writes the task's
    and the partition's names (the admin cuts each to its box)."""
    task, partition = split_scope(scope)
    if task is None:
        return "whole queue"
    if partition is None:
        return name(task)
    return f"{name(task)} · " + (f"partition {name(partition)}" if partition else "each partition")


@dataclass(frozen=True)
class FlowLimits:
    """Every limit a project sets: per task type (they apply in whichever queue its tasks are),
    per partition of a task type, and per queue."""

    types: Mapping[str, Limit]
    queues: Mapping[str, Limit]
    partitions: Mapping[str, PartitionLimits] = field(default_factory=dict)

    def for_queue(self, queue: str) -> dict[str, Limit]:
        """The limits claims from `queue` apply, by scope (task names, QUEUE_SCOPE, and the
        partition scopes of partitioned types)."""
        scopes = dict(self.types)
        for task, limits in self.partitions.items():
            if limits.each is not None:
                scopes[partition_scope(task)] = limits.each
            for partition, limit in limits.named.items():
                scopes[partition_scope(task, partition)] = limit
        if queue in self.queues:
            scopes[QUEUE_SCOPE] = self.queues[queue]
        return scopes

    def spec(self, queue: str) -> str:
        """The claim script's argument for `queue`: its limits as JSON, "" when it has none."""
        specs = self._specs
        if queue not in specs:
            scopes = self.for_queue(queue)
            specs[queue] = json.dumps({s: lim.as_spec() for s, lim in scopes.items()}) if scopes else ""
        return specs[queue]

    def holds(self, queue: str, task: str) -> bool:
        """Can a limit hold back a task of this type in this queue (it is then never handed
        straight to an idle worker at enqueue, which would pass the claim by)?"""
        return task in self.types or task in self.partitions or queue in self.queues

    def __bool__(self) -> bool:
        return bool(self.types or self.queues or self.partitions)

    @cached_property
    def _specs(self) -> dict[str, str]:
        return {}


NO_LIMITS = FlowLimits(types={}, queues={})


def no_limits() -> FlowLimits:
    return NO_LIMITS


#: What a broker asks for the limits in force (the Django side passes the project's).
LimitsSource = Callable[[], FlowLimits]


def bucket_tokens(raw: str | None, limit: Limit, now_ms: int) -> float | None:
    """The tokens of a rate limit's bucket at `now_ms`, from its stored "<tokens>:<updated ms>",
    read as claim.lua reads it (full when unused or unreadable; refilled from now if stamped later);
    None without a rate limit."""
    if limit.rate is None:
        return None
    match = BUCKET_PATTERN.fullmatch(raw or "")
    if match is None or float(match[1]) > limit.burst + 0.5:
        return float(limit.burst)
    tokens, at = float(match[1]), min(int(match[2]), now_ms)
    return min(float(limit.burst), tokens + (now_ms - at) * limit.rate / (limit.period * 1000))

"""The Prometheus collector: queue sizes, daily counters, flow control, tasks waiting for a worker
that can run them, workers and the outbox, read through the operations layer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..broker.inspect import STATS_STATES, LimitUse, QueueStats
from ..broker.timings import Histogram
from ..broker.waiting import WaitingKind
from ..exceptions import BrokerUnavailable
from ..operations import Operations
from ..outbox import OutboxStats

logger = logging.getLogger(__name__)

#: The states `rtq_tasks` reports, in the order of QueueStats' fields.
STATES = STATS_STATES

SECONDS_PER_DAY = 86400
REDIS_UP_HELP = "Whether the scrape could read Redis (1) or not (0)."


class RTQCollector(Collector):
    """Yields django-rtq's metric families, read from Redis (and the outbox's database) at each scrape."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops

    def collect(self) -> Iterator[Metric]:
        yield from self.from_redis()
        yield from self.from_outbox()

    def from_redis(self) -> Iterator[Metric]:
        """The families read from Redis, or only `rtq_redis_up` 0 if Redis cannot be read."""
        try:
            stats = [self.ops.queue_stats(name) for name in self.ops.queues()]
            timings = {s.queue: self.ops.task_timings(s.queue) for s in stats}
            limits = {s.queue: self.ops.flow_control(s.queue) for s in stats}
            held_in_partitions = {
                queue: self.ops.held_in_partitions(queue, uses) for queue, uses in limits.items()
            }
            waiting = {s.queue: self.ops.waiting_for_worker(s.queue) for s in stats}
            workers = self.ops.workers()
            day_started = self.ops.now() // SECONDS_PER_DAY * SECONDS_PER_DAY
        except BrokerUnavailable:
            yield GaugeMetricFamily("rtq_redis_up", REDIS_UP_HELP, 0)
            return
        yield GaugeMetricFamily("rtq_redis_up", REDIS_UP_HELP, 1)
        yield from queue_metrics(stats, day_started)
        yield from timing_metrics(timings)
        yield from limit_metrics(limits, held_in_partitions)
        yield from waiting_metrics(waiting)
        yield from worker_metrics(workers, [s.queue for s in stats])

    def from_outbox(self) -> Iterator[Metric]:
        """The outbox's families, read from its database: there while Redis is away (when the
        outbox fills), left out if the database cannot be read."""
        try:
            stats = self.ops.outbox_stats()
        except DatabaseError as exc:
            logger.warning("the metrics leave the outbox out: its database could not be read: %s", exc)
            return
        yield from outbox_metrics(stats)


def queue_metrics(stats: list[QueueStats], day_started: float) -> Iterator[Metric]:
    """The per-queue families: sizes by state, paused, oldest pending age, today's counters."""
    tasks = GaugeMetricFamily("rtq_tasks", "Tasks in a queue, by state.", labels=["queue", "state"])
    paused = GaugeMetricFamily(
        "rtq_queue_paused", "Whether the queue is paused (1) or not (0).", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "rtq_queue_oldest_pending_age_seconds",
        "Seconds since the next pending task of the queue was enqueued; 0 when nothing is pending.",
        labels=["queue"],
    )
    processed = CounterMetricFamily(
        "rtq_tasks_processed",
        "Attempts finished in the queue (succeeded or failed) since 00:00 UTC: resets daily.",
        labels=["queue"],
    )
    failed = CounterMetricFamily(
        "rtq_tasks_failed",
        "Attempts failed in the queue (retried or archived) since 00:00 UTC: resets daily.",
        labels=["queue"],
    )
    snoozed = CounterMetricFamily(
        "rtq_tasks_snoozed",
        "Attempts whose handler snoozed them (raised Snooze: scheduled again, no attempt counted) "
        "in the queue since 00:00 UTC: resets daily.",
        labels=["queue"],
    )
    for queue in stats:
        for state in STATES:
            tasks.add_metric([queue.queue, str(state)], getattr(queue, str(state)))
        paused.add_metric([queue.queue], int(queue.paused))
        oldest.add_metric([queue.queue], queue.oldest_pending_age or 0.0)
        # `created` tells Prometheus when the counter started from zero: the UTC day's start.
        processed.add_metric([queue.queue], queue.processed_today, created=day_started)
        failed.add_metric([queue.queue], queue.failed_today, created=day_started)
        snoozed.add_metric([queue.queue], queue.snoozed_today, created=day_started)
    yield from (tasks, paused, oldest, processed, failed, snoozed)


def timing_metrics(timings: dict[str, tuple[list[Histogram], list[Histogram]]]) -> Iterator[Metric]:
    """The histograms per task type: how long attempts ran, and how long first attempts waited."""
    ran = HistogramMetricFamily(
        "rtq_task_duration_seconds",
        "How long attempts ran, by task type and outcome (success or failure).",
        labels=["queue", "task", "outcome"],
    )
    waited = HistogramMetricFamily(
        "rtq_task_queue_latency_seconds",
        "How long first attempts waited to start, from when they were due (enqueued or scheduled).",
        labels=["queue", "task"],
    )
    for queue, (durations, waits) in sorted(timings.items()):
        for histogram in durations:
            ran.add_metric(
                [queue, histogram.task, histogram.outcome or ""], histogram.cumulative(), histogram.sum
            )
        for histogram in waits:
            waited.add_metric([queue, histogram.task], histogram.cumulative(), histogram.sum)
    yield from (ran, waited)


def limit_metrics(
    limits: dict[str, list[LimitUse]], held_in_partitions: dict[str, dict[str, int]]
) -> Iterator[Metric]:
    """The flow-control families, per queue and scope (a task type, or "*" for the queue's own),
    and per queue and task type for its partitions' scopes, summed.

    A type's partitions are not a label of their own: a project may partition by tenant, and one
    series per tenant would grow Prometheus without bound. Their use is summed per type instead:
    the slots their running tasks hold (every partition's, from the queue's `running` hash) and
    the tasks they hold back (counted in the held index per type: exact, however many partitions
    hold some). The admin's flow-control table, `rtq_stats` and the API list each partition with
    tasks running or held."""
    running = GaugeMetricFamily(
        "rtq_limit_running",
        "Concurrency slots held in a flow-control scope of the queue: its running tasks.",
        labels=["queue", "scope"],
    )
    held = GaugeMetricFamily(
        "rtq_limit_held",
        "Pending tasks of a task type held back by its flow-control limits (0 for the queue's own).",
        labels=["queue", "scope"],
    )
    partitions_running = GaugeMetricFamily(
        "rtq_limit_partitions_running",
        "Concurrency slots held in the flow-control scopes of a task type's partitions, summed.",
        labels=["queue", "task"],
    )
    partitions_held = GaugeMetricFamily(
        "rtq_limit_partitions_held",
        "Pending tasks of a task type held back by their partition's limits (or a snooze holding "
        "their partition), every partition summed.",
        labels=["queue", "task"],
    )
    for queue, uses in sorted(limits.items()):
        slots: dict[str, int] = dict.fromkeys(held_in_partitions.get(queue, {}), 0)
        for use in uses:
            if use.partition is None:
                running.add_metric([queue, use.scope], use.running)
                held.add_metric([queue, use.scope], use.held)
            elif use.task:
                slots[use.task] = slots.get(use.task, 0) + use.running
        for task, count in sorted(slots.items()):
            partitions_running.add_metric([queue, task], count)
            partitions_held.add_metric([queue, task], held_in_partitions.get(queue, {}).get(task, 0))
    yield from (running, held, partitions_running, partitions_held)


def waiting_metrics(waiting: dict[str, list[WaitingKind]]) -> Iterator[Metric]:
    """Pending tasks no worker could run, per queue, task type and why: they wait for one that can."""
    family = GaugeMetricFamily(
        "rtq_tasks_waiting_for_worker",
        "Pending tasks that wait for a worker able to run them: of a type the workers do not know "
        '(why="type"), stored in a newer format than they read ("format"), or with arguments their '
        'handler refuses ("args").',
        labels=["queue", "task", "why"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    for queue, kinds in waiting.items():
        for kind in kinds:  # arguments refused by different handler signatures are kinds of their own
            labels = (queue, kind.task, kind.why)
            counts[labels] = counts.get(labels, 0) + kind.count
    for labels, count in sorted(counts.items()):
        family.add_metric(list(labels), count)
    yield family


def outbox_metrics(stats: OutboxStats) -> Iterator[Metric]:
    """How many tasks wait in the outbox, how long the oldest has, how many failed to send."""
    yield GaugeMetricFamily(
        "rtq_outbox_waiting", "Tasks waiting in the outbox to be sent to Redis.", stats.waiting
    )
    yield GaugeMetricFamily(
        "rtq_outbox_oldest_age_seconds",
        "Seconds the oldest task of the outbox has waited to be sent to Redis; 0 when none waits.",
        stats.age_seconds() or 0.0,
    )
    yield GaugeMetricFamily(
        "rtq_outbox_failing",
        "Tasks of the outbox that a relay tried to send and could not (each keeps its last error).",
        stats.failing,
    )


def worker_metrics(workers: list[dict[str, Any]], queues: list[str]) -> Iterator[Metric]:
    """The worker families: how many are alive, their threads and running tasks, consumers per queue."""
    yield GaugeMetricFamily("rtq_workers", "Workers whose heartbeat is current.", len(workers))
    yield GaugeMetricFamily(
        "rtq_worker_threads",
        "Task threads of the live workers (their concurrency, summed).",
        sum(_number(worker.get("concurrency")) for worker in workers),
    )
    yield GaugeMetricFamily(
        "rtq_worker_running_tasks",
        "Tasks the live workers are running.",
        sum(len(worker.get("active") or []) for worker in workers),
    )
    consumers = GaugeMetricFamily(
        "rtq_queue_workers", "Live workers that consume the queue.", labels=["queue"]
    )
    counts = dict.fromkeys(queues, 0)
    for worker in workers:
        for name in _queue_names(worker.get("queues")):
            counts[name] = counts.get(name, 0) + 1
    for name, count in sorted(counts.items()):
        consumers.add_metric([name], count)
    yield consumers


def _queue_names(queues: Any) -> list[str]:
    """A worker's queues as its info has them: {name: weight} or a list of names."""
    if isinstance(queues, dict | list):
        return [str(name) for name in queues]
    return []


def _number(value: Any) -> float:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def registry_for(ops: Operations) -> CollectorRegistry:
    """A registry of its own per scrape: nothing is registered globally, so importing this module
    changes no other metrics the project exposes."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RTQCollector(ops))
    return registry

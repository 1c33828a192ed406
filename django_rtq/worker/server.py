"""The worker server: starts one process's components from a list and stops them in order."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from ..broker import Broker
from ..conf import RTQSettings, get_settings
from ..connection import get_broker
from ..exceptions import BrokerUnavailable
from ..periodic import load_entries
from ..projects import current_project
from ..queue_names import named_queues
from .bulk_runner import BulkRunner
from .commander import Commander
from .forwarder import Forwarder
from .health import HealthBeat, HealthFile, resident_mb
from .healthchecker import Healthchecker
from .heartbeater import Heartbeater
from .janitor import Janitor
from .mirrorer import Mirrorer
from .neighbours import NeighbourWatch
from .processor import Processor
from .pruner import Pruner
from .recoverer import Recoverer
from .redis_watch import RedisWatch
from .relay import Relay
from .scheduler import Scheduler
from .subscriber import Subscriber
from .syncer import Syncer

logger = logging.getLogger(__name__)

#: Exit status of a worker that stopped because one of its threads died.
EXIT_THREAD_DIED = 1
#: Exit status of a burst worker that gave up waiting for an unreachable Redis.
EXIT_REDIS_UNREACHABLE = 3
#: Exit status of a supervised worker process that reached its --max-tasks-per-child or
#: --max-memory-per-child: its supervisor starts a replacement at once.
EXIT_RECYCLED = 4
#: Seconds a burst worker waits for an unreachable Redis before it gives up (by default).
BURST_GIVE_UP_AFTER = 30.0
#: Seconds the process of a stopped worker gets to exit by itself before it ends without
#: waiting for the threads its handlers left running.
EXIT_GRACE_SECONDS = 3.0


class Worker:
    """One worker process: a processor and the components that keep its tasks safe.

    `run()` blocks until SIGTERM or SIGINT (or, with `burst`, until the queues are drained, or
    Redis has been unreachable for `give_up_after` seconds), then shuts down gracefully:
    unfinished tasks go back to pending. A worker that is not a burst one waits for Redis as
    long as it takes. `relay` says whether it relays the outbox (by default, when the settings
    use it). `watch_redis` says whether its healthchecker checks Redis's configuration and
    looks for restarts that lost the data (not in a test's burst worker, on a throwaway Redis).

    `health` (by default a HealthFile at RTQ["HEALTH_FILE"], if set) is told, several times a
    second while every thread of the worker is alive, whether Redis answers. With `max_tasks`
    or `max_memory_mb` (a supervised worker process, --max-tasks-per-child and
    --max-memory-per-child) it stops claiming once it claimed that many tasks, or once its
    resident memory exceeds that many MB after a task, stops as on SIGTERM and exits with
    EXIT_RECYCLED.
    """

    def __init__(
        self,
        *,
        queues: dict[str, int] | None = None,
        concurrency: int | None = None,
        strict: bool | None = None,
        burst: bool = False,
        shutdown_timeout: float | None = None,
        give_up_after: float | None = None,
        broker: Broker | None = None,
        settings: RTQSettings | None = None,
        relay: bool | None = None,
        watch_redis: bool = True,
        health: HealthBeat | None = None,
        max_tasks: int | None = None,
        max_memory_mb: float | None = None,
    ) -> None:
        conf = settings or get_settings()
        self.conf = conf
        self.broker = broker or get_broker()
        self.queues = dict(queues or conf.QUEUES)
        self.burst = burst
        self.give_up_after = BURST_GIVE_UP_AFTER if give_up_after is None else give_up_after
        self.shutdown_timeout = conf.SHUTDOWN_TIMEOUT if shutdown_timeout is None else shutdown_timeout
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop_requested = threading.Event()

        self.syncer = Syncer(interval=conf.SYNCER_INTERVAL)
        self.processor = Processor(
            broker=self.broker,
            worker_id=self.id,
            queues=self.queues,
            concurrency=concurrency or conf.CONCURRENCY,
            syncer=self.syncer,
            strict=conf.STRICT_PRIORITY if strict is None else strict,
            idle_wait=conf.IDLE_WAIT,
            burst=burst,
        )
        self.health = health or (
            HealthFile(conf.HEALTH_FILE, conf.HEALTHCHECK_INTERVAL) if conf.HEALTH_FILE else None
        )
        self.max_tasks = max_tasks
        self.max_memory_mb = max_memory_mb
        self.processor.fetcher.claims_left = max_tasks
        self._over_memory: str | None = None
        if max_memory_mb is not None:
            self.processor.executor.after_task = self._look_at_memory
        names = list(self.queues)
        self.heartbeater = Heartbeater(
            broker=self.broker,
            worker_id=self.id,
            processor=self.processor,
            interval=conf.HEARTBEAT_INTERVAL,
            neighbours=NeighbourWatch(broker=self.broker, worker_id=self.id, project=current_project()),
        )
        self.forwarder = Forwarder(broker=self.broker, queues=names, interval=conf.FORWARDER_INTERVAL)
        self.scheduler = Scheduler(
            broker=self.broker, entries=load_entries(conf), interval=conf.SCHEDULER_INTERVAL
        )
        self.recoverer = Recoverer(
            broker=self.broker,
            queues=names,
            interval=conf.RECOVERER_INTERVAL,
            grace=conf.RECOVERY_GRACE,
            max_recoveries=conf.MAX_RECOVERIES,
            # long enough for every live worker to renew its leases after an outage
            settle_seconds=self.broker.lease_ms / 1000 + conf.HEARTBEAT_INTERVAL,
        )
        self.janitor = Janitor(
            broker=self.broker,
            queues=names,
            interval=conf.JANITOR_INTERVAL,
            archive_max_age=conf.ARCHIVE_MAX_AGE,
            archive_max_size=conf.ARCHIVE_MAX_SIZE,
            no_worker_grace=conf.NO_WORKER_GRACE,
            forget_queues_after=conf.FORGET_EMPTY_QUEUES_AFTER,
        )
        # A pass works on each unfinished job for 2 s: a request carried it on for 1 s at most.
        self.bulk_runner = BulkRunner(broker=self.broker, queues=names, interval=1.0, budget=2.0)
        self.mirrorer = (
            Mirrorer(
                broker=self.broker,
                worker_id=self.id,
                queues=names,
                interval=conf.MIRROR_INTERVAL,
                batch_size=conf.MIRROR_BATCH_SIZE,
                using=conf.MIRROR_DATABASE,
                busy=lambda: self.processor.busy,
            )
            if self.broker.mirror
            else None
        )
        self.pruner = (
            Pruner(
                broker=self.broker,
                worker_id=self.id,
                max_age=conf.MIRROR_MAX_AGE,
                every=conf.MIRROR_PRUNE_INTERVAL,
                using=conf.MIRROR_DATABASE,
            )
            if self.broker.mirror and conf.MIRROR_MAX_AGE is not None
            else None
        )
        if relay is None:
            relay = conf.OUTBOX or conf.OUTBOX_FALLBACK
        self.relay = (
            Relay(broker=self.broker, interval=conf.OUTBOX_RELAY_INTERVAL, using=conf.OUTBOX_DATABASE)
            if relay
            else None
        )
        if self.relay is not None and burst:
            # A burst worker relays the due rows before it decides its queues are drained, not in
            # a thread of its own that it could outrun (it would exit leaving them in the outbox).
            self.processor.fetcher.before_drained = self._relay_before_drained
        self.commander = Commander(broker=self.broker, queues=names, interval=conf.COMMAND_INTERVAL)
        self.processor.on_commands = self.commander.wake
        self.healthchecker = Healthchecker(
            broker=self.broker,
            interval=conf.HEALTHCHECK_INTERVAL,
            callback=_health_callback(conf.HEALTH_CHECK),
            watch=RedisWatch(broker=self.broker, held=self._held, eviction_allowed=conf.ALLOW_EVICTING_REDIS)
            if watch_redis
            else None,
        )
        self.subscriber = Subscriber(
            broker=self.broker,
            channels=[self.broker.keys.cancel_channel],
            on_message=lambda channel, task_id: self.processor.cancel(task_id),
            name="cancel",
        )

    def _relay_before_drained(self) -> int:
        """A burst worker's relay pass; one that fails for another reason than Redis being away
        is logged and relays nothing, so that the worker still exits once drained."""
        try:
            return self.relay.run_once()
        except BrokerUnavailable:
            raise  # the fetcher waits for Redis, as long as --give-up-after allows
        except Exception:
            logger.exception("relaying the outbox before the burst worker exits failed")
            return 0

    def _held(self) -> dict[str, list[str]]:
        """The ids of the tasks the processor holds (claimed or running), by queue."""
        held = self.processor.owned_by_queue()
        return {queue: [task_id for task_id, _ in tasks] for queue, tasks in held.items()}

    def components(self) -> list[Any]:
        """The components besides the processor, in start order."""
        return [
            component
            for component in (
                self.syncer,
                self.healthchecker,
                self.heartbeater,
                self.subscriber,
                self.forwarder,
                self.scheduler,
                self.recoverer,
                self.janitor,
                self.bulk_runner,
                self.mirrorer,
                self.pruner,
                None if self.burst else self.relay,  # a burst worker's relays as it drains
                self.commander,
            )
            if component is not None
        ]

    def start(self) -> None:
        logger.info("worker %s starting on queues %s", self.id, self.queues)
        self._warn_of_unknown_queues()
        with contextlib.suppress(BrokerUnavailable):  # if so, the janitor's passes announce them
            self.janitor.announce_signatures()
        for component in self.components():
            component.start()
        self.processor.start()

    def _warn_of_unknown_queues(self) -> None:
        """Warn of a queue to serve that the project names nowhere and nothing was ever enqueued
        to: likely a typo in --queues, which would leave the worker idle for good."""
        unnamed = [queue for queue in self.queues if queue not in named_queues()]
        if not unnamed:
            return
        try:
            ever_used = set(self.broker.known_queues())
        except BrokerUnavailable:
            ever_used = set()  # the healthchecker tells of the outage
        for queue in unnamed:
            if queue not in ever_used:
                logger.warning(
                    "queue %r is named nowhere in the project (RTQ['QUEUES'], a task type, a schedule "
                    "or a TASKS backend) and nothing was ever enqueued to it: a typo? Known queues: %s.",
                    queue,
                    ", ".join(sorted(named_queues() | ever_used)),
                )

    def dead_threads(self) -> list[str]:
        """Names of the threads that died although nobody stopped them (then the worker can no
        longer do its job)."""
        dead = [f"rtq-{component.name}" for component in self.components() if not component.is_alive()]
        return dead + self.processor.dead_threads()

    def stop(self) -> None:
        """Shut down: the processor first (it stops claiming, finishes or gives back its tasks),
        while the heartbeater still extends leases and the subscriber still hears cancellations;
        the syncer last, so that it flushes whatever the others could not write."""
        logger.info(
            "worker %s stopping (waiting up to %ss for running tasks)",
            self.id,
            self.shutdown_timeout,
        )
        self.processor.stop(self.shutdown_timeout)
        for component in (
            self.subscriber,
            self.heartbeater,
            self.forwarder,
            self.scheduler,
            self.recoverer,
            self.janitor,
            self.bulk_runner,
            self.mirrorer,
            self.pruner,
            self.relay,
            self.commander,
            self.healthchecker,
            self.syncer,
        ):
            if component is not None:
                component.stop()
        logger.info("worker %s stopped", self.id)

    def request_stop(self, *_: Any) -> None:
        self._stop_requested.set()

    def run(self) -> int:
        """Start, wait for a stop signal (or a drained burst), then stop gracefully. Return the
        exit status: 0; EXIT_THREAD_DIED if a thread of the worker died and it stopped because of
        that (its supervisor, or the process manager, should start it again); or
        EXIT_REDIS_UNREACHABLE if it is a burst worker that gave up waiting for Redis."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        self.start()
        status = 0
        while not self._stop_requested.wait(0.2):
            if self.burst and self.processor.drained.is_set():
                break
            if self.burst and self.healthchecker.outage_seconds() > self.give_up_after:
                logger.critical(
                    "burst worker %s gives up: Redis has been unreachable for more than %gs",
                    self.id,
                    self.give_up_after,
                )
                status = EXIT_REDIS_UNREACHABLE
                break
            dead = self.dead_threads()
            if dead:
                logger.critical(
                    "worker %s cannot go on: thread(s) %s died; stopping", self.id, ", ".join(dead)
                )
                status = EXIT_THREAD_DIED
                break
            if self.health is not None:
                self.health.beat(self.healthchecker.healthy)
            why = self._recycle_reason()
            if why:
                logger.info("worker %s is recycled: %s", self.id, why)
                status = EXIT_RECYCLED
                break
        self.stop()
        if self.health is not None:
            self.health.remove()
        return status

    def _recycle_reason(self) -> str | None:
        """Why the worker should stop to be replaced now, if it should."""
        if self._over_memory is not None:
            return self._over_memory
        if (
            self.max_tasks is not None
            and self.processor.fetcher.claims_left <= 0
            and not self.processor.jobs.in_flight
        ):
            return f"it ran its {self.max_tasks} tasks (--max-tasks-per-child)"
        return None

    def _look_at_memory(self) -> None:
        """After each task, on its thread: over the memory limit, start no other task."""
        if self._over_memory is not None or self.max_memory_mb is None:
            return
        used = resident_mb()
        if used > self.max_memory_mb:
            self._over_memory = (
                f"it uses {used:.0f} MB, over {self.max_memory_mb:g} MB (--max-memory-per-child)"
            )
            self.processor.stop_claiming()


def exit_in_time(status: int, grace: float = EXIT_GRACE_SECONDS) -> None:
    """See that the process of a stopped worker exits, with `status`, within `grace` seconds.

    Python's exit waits for every thread a handler left running (the jobs of a
    `ThreadPoolExecutor` it did not shut down, non-daemon threads) for as long as they run, so
    a worker would never exit. Their tasks are settled or given back by then: a daemon thread
    logs the threads left and ends the process. Only for a process that is a worker, never
    one that runs a worker among other things (a test's)."""
    timer = threading.Timer(grace, _end_process, args=(status, grace))
    timer.name = "rtq-exit"
    timer.daemon = True
    timer.start()


def _end_process(status: int, grace: float) -> None:
    left = [
        thread.name
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and thread is not threading.current_thread()
    ]
    logger.warning(
        "the worker has stopped but its process did not exit within %gs: it exits without waiting "
        "for the threads its handlers left running: %s",
        grace,
        ", ".join(left) or "none",
    )
    logging.shutdown()  # flushes the handlers, which os._exit would not
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _health_callback(value: Any) -> Callable[[bool, Exception | None], None] | None:
    if isinstance(value, str):
        return import_string(value)
    return value

"""`manage.py rtq_worker`: run a worker (or several worker processes) on the given queues."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_rtq.conf import get_settings, parse_queues
from django_rtq.connection import get_broker
from django_rtq.discovery import failed_modules
from django_rtq.exceptions import BrokerUnavailable, RedisMisconfigured
from django_rtq.worker.health import HealthFile
from django_rtq.worker.redis_watch import refuse_unfit_redis
from django_rtq.worker.server import BURST_GIVE_UP_AFTER, EXIT_REDIS_UNREACHABLE, Worker, exit_in_time
from django_rtq.worker.supervisor import Supervisor


class Command(BaseCommand):
    help = "Run a django-rtq worker: claim tasks from the queues and run them."
    #: Whether the process is this command's (manage.py), not one that called it (call_command()).
    owns_process = False

    def run_from_argv(self, argv: list[str]) -> None:
        self.owns_process = True
        super().run_from_argv(argv)

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--queues",
            "-Q",
            help='Queues to serve, with optional weights: "critical:6,default:3,low:1". '
            "Default: settings.RTQ['QUEUES'].",
        )
        parser.add_argument("--concurrency", "-c", type=int, help="Tasks run at once per process (threads).")
        parser.add_argument(
            "--processes",
            "-p",
            type=int,
            default=1,
            help="Worker processes to run, supervised and restarted if they die.",
        )
        parser.add_argument(
            "--strict",
            action="store_true",
            default=None,
            help="Strict priority: always serve heavier queues first.",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit once every queue is empty and nothing scheduled is due (the outbox's due "
            "tasks relayed first).",
        )
        parser.add_argument(
            "--give-up-after",
            type=float,
            metavar="SECONDS",
            help=(
                f"With --burst: exit with status {EXIT_REDIS_UNREACHABLE} once Redis has been "
                f"unreachable this long (default {BURST_GIVE_UP_AFTER:g})."
            ),
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            help="Seconds running tasks get to finish on SIGTERM before they go back to pending.",
        )
        parser.add_argument(
            "--health-file",
            metavar="PATH",
            help="Rewrite this file while every thread of the worker is alive, for "
            "`python -m django_rtq.probe live|ready --file PATH`. Default: settings.RTQ['HEALTH_FILE'].",
        )
        parser.add_argument(
            "--max-tasks-per-child",
            type=int,
            metavar="N",
            help="Replace each worker process after it ran N tasks (runs the worker processes "
            "under a supervisor, even with --processes 1).",
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=float,
            metavar="MB",
            help="Replace a worker process whose resident memory exceeds MB after a task (runs the "
            "worker processes under a supervisor, even with --processes 1).",
        )
        parser.add_argument(
            "--loglevel",
            "-l",
            default="INFO",
            type=str.upper,
            choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
            help="Level of the django_rtq loggers.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._configure_logging(options["loglevel"])
        if failed_modules:
            raise CommandError(
                "The worker does not start: it would archive the tasks of these task modules, which "
                "could not be imported, as of an unknown task type:\n\n"
                + "\n\n".join(f"{name}:\n{error}" for name, error in failed_modules.items())
            )
        conf = get_settings()
        try:
            queues = parse_queues(options["queues"]) if options["queues"] else conf.QUEUES
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1.")
        if options["processes"] < 1:
            raise CommandError("--processes must be at least 1.")
        for name in ("max_tasks_per_child", "max_memory_per_child"):
            if options[name] is not None and options[name] <= 0:
                raise CommandError(f"--{name.replace('_', '-')} must be more than 0.")
        health_file = options["health_file"] or conf.HEALTH_FILE
        try:
            refuse_unfit_redis(get_broker(), eviction_allowed=conf.ALLOW_EVICTING_REDIS)
        except RedisMisconfigured as exc:
            raise CommandError(str(exc)) from None
        except BrokerUnavailable:
            pass  # the worker waits for Redis; its Redis watch checks the configuration then
        worker_options = {
            "queues": queues,
            "concurrency": options["concurrency"],
            "strict": options["strict"],
            "burst": options["burst"],
            "shutdown_timeout": options["shutdown_timeout"],
            "give_up_after": options["give_up_after"],
        }
        recycled = options["max_tasks_per_child"] is not None or options["max_memory_per_child"] is not None
        if options["processes"] == 1 and not recycled:
            health = HealthFile(health_file, conf.HEALTHCHECK_INTERVAL) if health_file else None
            status = Worker(**worker_options, health=health).run()
            if self.owns_process:
                exit_in_time(status)  # whatever threads its handlers left running
            if status:
                sys.exit(status)
        else:
            timeout = (
                conf.SHUTDOWN_TIMEOUT if options["shutdown_timeout"] is None else options["shutdown_timeout"]
            )
            status = Supervisor(
                processes=options["processes"],
                worker_options={
                    **worker_options,
                    "max_tasks": options["max_tasks_per_child"],
                    "max_memory_mb": options["max_memory_per_child"],
                },
                shutdown_timeout=timeout,
                health_file=health_file,
                health_interval=conf.HEALTHCHECK_INTERVAL,
            ).run()
            if status:
                sys.exit(status)

    def _configure_logging(self, level: str) -> None:
        logger = logging.getLogger("django_rtq")
        logger.setLevel(level)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)

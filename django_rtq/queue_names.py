"""The queues a project names (settings, task types, backends, schedules): any other is likely a typo."""

from __future__ import annotations

import logging
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import RTQSettings, get_settings, rtq_task_backends

logger = logging.getLogger("django_rtq")

_named: frozenset[str] | None = None
_warned: set[str] = set()
#: The queues registered task types name (the registry tells them: see note_task_queue).
_task_queues: set[str] = set()


def named_queues() -> frozenset[str]:
    """Every queue the project names: `RTQ["QUEUES"]` and `DEFAULT_QUEUE`, the `queue` of each
    registered task type and periodic schedule, and the `QUEUES` of django-rtq's backends in
    `settings.TASKS`. Kept until a task type is registered or those settings change."""
    global _named
    if _named is None:
        conf = get_settings()
        _named = frozenset({*conf.QUEUES, *queues_named_elsewhere(conf)})
    return _named


def note_task_queue(queue: str) -> None:
    """Count a registered task type's queue among the named ones."""
    global _named
    if queue not in _task_queues:
        _task_queues.add(queue)
        _named = None


def warn_if_unnamed(queue: str, task_name: str) -> None:
    """Log, once per queue and process, an enqueue to a queue the project names nowhere: its tasks
    wait until a worker is started with `--queues` naming it, which is unlikely for a typo."""
    if queue in named_queues() or queue in _warned:
        return
    _warned.add(queue)
    logger.warning(
        "task %r was enqueued to queue %r, which the project names nowhere (not in RTQ['QUEUES'], "
        "nor the queue of a task type, schedule or TASKS backend): only a worker started with "
        "--queues %s will run it. Known queues: %s.",
        task_name,
        queue,
        queue,
        ", ".join(sorted(named_queues())),
    )


def queues_named_elsewhere(conf: RTQSettings) -> set[str]:
    """The queues named besides `RTQ["QUEUES"]`: DEFAULT_QUEUE, task types, backends, schedules."""
    names = {conf.DEFAULT_QUEUE, *_task_queues}
    for config in rtq_task_backends().values():
        queues = config.get("QUEUES")
        if isinstance(queues, list | tuple | set | frozenset):
            names |= {queue for queue in queues if isinstance(queue, str)}
    if isinstance(conf.PERIODIC, dict):  # a schedule of settings may name its own queue
        names |= {
            spec["queue"]
            for spec in conf.PERIODIC.values()
            if isinstance(spec, dict) and isinstance(spec.get("queue"), str)
        }
    return names


@receiver(setting_changed)
def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    global _named
    if setting in ("RTQ", "TASKS"):
        _named = None
        _warned.clear()

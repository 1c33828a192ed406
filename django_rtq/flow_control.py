"""The project's flow-control limits: task types' (and their partitions') and `RTQ["QUEUE_LIMITS"]`."""

from __future__ import annotations

from .broker.limits import FlowLimits
from .conf import RTQSettings, get_settings
from .registry import registered_tasks, registry_generation

_cached: tuple[int, RTQSettings, FlowLimits] | None = None


def project_limits() -> FlowLimits:
    """Every limit the project sets, as the broker applies them; rebuilt when a task type is
    registered or the settings change."""
    global _cached
    conf, generation = get_settings(), registry_generation()
    if _cached is None or _cached[0] != generation or _cached[1] is not conf:
        tasks = registered_tasks().items()
        types = {name: limit for name, task_type in tasks if (limit := task_type.limit)}
        partitions = {name: limits for name, task_type in tasks if (limits := task_type.partition_limits)}
        _cached = (
            generation,
            conf,
            FlowLimits(types=types, queues=dict(conf.QUEUE_LIMITS), partitions=partitions),
        )
    return _cached[2]

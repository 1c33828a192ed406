"""The Redis watch: checks Redis's own configuration (eviction, persistence) when the worker
starts and after each restart of a master, and tells of a restart that lost the data."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..broker import Broker
from ..broker.redis_config import findings, node_of_queue, read_configs, read_runs
from ..exceptions import RedisMisconfigured

logger = logging.getLogger(__name__)

#: The tasks the worker holds (claimed or running), by queue.
Held = Callable[[], dict[str, list[str]]]


def refuse_unfit_redis(broker: Broker, *, eviction_allowed: bool) -> None:
    """Raise RedisMisconfigured, naming what is wrong and what it loses, when a master of the
    worker's Redis evicts keys (and the project does not accept it) or is older than 7.0.
    Redis's absence raises BrokerUnavailable; a configuration that cannot be read does not
    raise (the watch warns)."""
    errors = [
        finding
        for finding in findings(read_configs(broker.client), eviction_allowed=eviction_allowed)
        if finding.is_error
    ]
    if errors:
        raise RedisMisconfigured(
            "The worker does not start: "
            + " ".join(f"{finding.message} {finding.hint}" for finding in errors)
        )


class RedisWatch:
    """Reads each master's run_id and restart marker (one round trip per master); the
    healthchecker calls `look()` after each ping that Redis answered.

    A master whose run_id changed restarted. Its marker, a key written under the run_id of its
    server, is gone, or was written again under the new run_id by another worker, when the
    restart lost the data: that is logged as an ERROR naming the leases this worker held there.
    The configuration is checked at the first look and after each restart: an evicting master
    is logged as an ERROR (the worker refused to start on one, but it may have been changed
    since), no persistence or a configuration that cannot be read as a WARNING."""

    def __init__(self, *, broker: Broker, held: Held, eviction_allowed: bool = False) -> None:
        self.broker = broker
        self.held = held
        self.eviction_allowed = eviction_allowed
        self._run_ids: dict[str, str] = {}  # master -> its run_id at the last look
        self._config_checked = False

    def look(self) -> None:
        restarted = False
        for run in read_runs(self.broker.client, self.broker.keys):
            before = self._run_ids.get(run.node)
            self._run_ids[run.node] = run.run_id
            if before is None or before == run.run_id:
                continue
            restarted = True
            if run.marker is None or run.marker == run.run_id:
                self._tell_lost(run.node, before, run.run_id)
            else:
                logger.warning(
                    "Redis at %s is another server process (run_id %s→%s: a restart or a failover) "
                    "and kept its data",
                    run.node,
                    before,
                    run.run_id,
                )
        if restarted or not self._config_checked:
            self.check_config()

    def check_config(self) -> None:
        """Log what is wrong with the masters' configuration."""
        for finding in findings(read_configs(self.broker.client), eviction_allowed=self.eviction_allowed):
            level = logging.ERROR if finding.is_error else logging.WARNING
            logger.log(level, "%s %s", finding.message, finding.hint)
        self._config_checked = True

    def _tell_lost(self, node: str, before: str, now: str) -> None:
        client, keys = self.broker.client, self.broker.keys
        lost = [
            f"{task_id} ({queue})"
            for queue, task_ids in sorted(self.held().items())
            if node_of_queue(client, keys, queue) in (None, node)
            for task_id in task_ids
        ]
        logger.error(
            "Redis at %s restarted without its data (run_id %s→%s): the tasks that were pending, "
            "scheduled, retrying or running there are gone, with their results, workflows' state "
            "and uniqueness locks; %d lease(s) held by this worker were lost%s. Their handlers run "
            "on, but their outcomes cannot be recorded. See docs/redis.md for persistence.",
            node,
            before,
            now,
            len(lost),
            ": " + ", ".join(lost) if lost else "",
        )

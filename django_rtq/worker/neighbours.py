"""The neighbour watch: warns, once per project, of workers of another Django project that share
this worker's Redis database and key prefix (see django_rtq/projects.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..broker import Broker
from ..broker.inspect import Inspector
from ..projects import SHARING_HINT, Project, other_projects, sharing_problem

logger = logging.getLogger(__name__)

#: Seconds between two looks at the worker registry: a worker of another project that starts is
#: told of within this.
WATCH_INTERVAL = 10.0


class NeighbourWatch:
    """Reads the live workers' ids now and then (one ZRANGEBYSCORE), and the info of those it has
    not seen before; logs a WARNING the first time it meets a worker of another project. The
    heartbeater calls `look()` after each beat."""

    def __init__(
        self,
        *,
        broker: Broker,
        worker_id: str,
        project: Project,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inspector = Inspector(broker)
        self.key_prefix = broker.keys.prefix
        self.worker_id = worker_id
        self.project = project
        self.interval = WATCH_INTERVAL if interval is None else interval
        self.clock = clock
        self._next_look = 0.0
        self._seen: set[str] = {worker_id}
        self._told: set[str] = set()  # fingerprints of the projects already warned of

    @property
    def seen(self) -> frozenset[str]:
        """The ids of the workers live at the last look (and this worker's)."""
        return frozenset(self._seen)

    @property
    def told(self) -> frozenset[str]:
        """The fingerprints of the other projects this worker has warned of."""
        return frozenset(self._told)

    def look(self) -> None:
        """Warn of workers of other projects that appeared since the last look, when one is due."""
        now = self.clock()
        if now < self._next_look:
            return
        self._next_look = now + self.interval
        ids = self.inspector.live_worker_ids()
        new = [worker_id for worker_id in ids if worker_id not in self._seen]
        self._seen = {self.worker_id, *ids}
        if not new:
            return
        infos = self.inspector.worker_infos(new).values()
        for fingerprint, workers in other_projects(self.project, infos).items():
            if fingerprint in self._told:
                continue
            self._told.add(fingerprint)
            logger.warning("%s %s", sharing_problem(workers, self.key_prefix), SHARING_HINT)

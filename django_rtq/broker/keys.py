"""Every Redis key name django-rtq uses; no key is built anywhere else.

All keys of a queue share the queue's hash tag (`rtq:{emails}:...`), so a queue lives in
one Redis Cluster slot and every script touches one slot, with all its keys declared.
A task is spread over per-queue hashes keyed by task id (its "columns"), so that scripts
that discover task ids at run time still only touch keys their caller declared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from ..defaults import DEFAULT_KEY_PREFIX

#: The keys the enqueue script takes first (KEYS[1..14] of enqueue.lua), as QueueKeys names them.
ENQUEUE_KEYS = (
    "msg", "state", "priority", "pending", "scheduled", "seq", "active", "owner", "idle", "paused", "runs",
    "holds", "lanes", "vclock",
)  # fmt: skip

#: The keys forget_queue.lua takes, in its header's order (QueueKeys names them): three it reads
#: apart, then those whose existence means the queue is in use (tasks in any state, work under
#: way, a pause), then those it deletes when it forgets the queue.
FORGET_KEYS = (
    "empty_since", "idle", "applied",
    "pending", "active", "scheduled", "retry", "archived", "completed", "waiting", "state", "msg",
    "held", "parked", "unstarted", "commands", "command", "finished", "bulk", "outboxed", "paused",
    "seq", "timings", "periodic", "parked_kinds", "buckets", "running", "slots", "info", "result",
    "owner", "priority", "runs", "progress", "began", "holds", "lanes", "vclock",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue."""

    name: str
    prefix: str  # rtq:{<queue>}:
    # ENQUEUE_KEYS of this queue, named once: every enqueue sends them
    enqueue_keys: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "enqueue_keys", tuple(self.prefix + name for name in ENQUEUE_KEYS))

    @property
    def forget_keys(self) -> tuple[str, ...]:  # FORGET_KEYS of this queue
        return tuple(self.prefix + name for name in FORGET_KEYS)

    # Sorted sets of task ids
    @property
    def pending(self) -> str:  # ZSET id -> priority band + FIFO sequence
        return self.prefix + "pending"

    @property
    def active(self) -> str:  # ZSET id -> lease expiry (ms)
        return self.prefix + "active"

    @property
    def scheduled(self) -> str:  # ZSET id -> process-at (ms)
        return self.prefix + "scheduled"

    @property
    def retry(self) -> str:  # ZSET id -> next attempt (ms)
        return self.prefix + "retry"

    @property
    def archived(self) -> str:  # ZSET id -> archived at (ms)
        return self.prefix + "archived"

    @property
    def completed(self) -> str:  # ZSET id -> retention ends (ms)
        return self.prefix + "completed"

    # Task columns: hashes keyed by task id
    @property
    def msg(self) -> str:  # HASH id -> TaskMessage JSON, written at enqueue (an edit replaces its arguments)
        return self.prefix + "msg"

    @property
    def state(self) -> str:  # HASH id -> TaskState
        return self.prefix + "state"

    @property
    def info(self) -> str:  # HASH id -> JSON of attempt facts (retried, last error, times)
        return self.prefix + "info"

    @property
    def result(self) -> str:  # HASH id -> return value JSON of completed tasks
        return self.prefix + "result"

    @property
    def owner(self) -> str:  # HASH id -> id of the worker holding the lease
        return self.prefix + "owner"

    @property
    def priority(self) -> str:  # HASH id -> priority, only where it is not 0
        return self.prefix + "priority"

    @property
    def runs(self) -> str:  # HASH id -> number of the latest claim: the fencing token of a run
        return self.prefix + "runs"

    @property
    def unstarted(self) -> str:  # SET ids claimed into a worker's memory whose handler has not started
        return self.prefix + "unstarted"

    @property
    def began(self) -> str:  # HASH id -> "<run>:<ms>": when that run of an active task began
        return self.prefix + "began"

    # Queue-wide
    @property
    def seq(self) -> str:  # STRING counter giving pending tasks their FIFO order
        return self.prefix + "seq"

    @property
    def paused(self) -> str:  # STRING, present while the queue is paused
        return self.prefix + "paused"

    @property
    def idle(self) -> str:  # ZSET worker id -> registration expiry (ms): workers waiting for work
        return self.prefix + "idle"

    @property
    def periodic(self) -> str:  # HASH schedule name -> last tick (ms) enqueued (or passed over)
        return self.prefix + "periodic"

    @property
    def wake_channel(self) -> str:  # pub/sub channel: pending went from empty to non-empty
        return self.prefix + "wake"

    @property
    def handoff_prefix(self) -> str:
        return self.prefix + "handoff:"

    def handoff_channel(self, worker_id: str) -> str:  # pub/sub channel: tasks handed to a worker
        return self.handoff_prefix + worker_id

    @property
    def finished(self) -> str:  # HASH id -> JSON record of a finished task, until it is in the ORM
        return self.prefix + "finished"

    @property
    def mirror_lock(self) -> str:  # STRING id of the worker mirroring this queue's finished tasks
        return self.prefix + "mirror_lock"

    @property
    def progress(self) -> str:  # HASH id -> JSON {"done", "total"} a running task reported
        return self.prefix + "progress"

    @property
    def bulk(self) -> str:  # HASH job id -> JSON of an action on whole states (broker/bulk.py)
        return self.prefix + "bulk"

    @property
    def timings(self) -> str:  # HASH histogram field -> count or sum (broker/timings.py)
        return self.prefix + "timings"

    # Flow control (broker/limits.py)
    @property
    def held(self) -> str:  # ZSET, all scores 0: "<task>\0<pending score>\0<id>" of tasks held back
        return self.prefix + "held"

    @property
    def buckets(self) -> str:  # HASH scope -> "<tokens>:<updated at (ms)>": each rate limit's bucket
        return self.prefix + "buckets"

    @property
    def running(self) -> str:  # HASH scope -> concurrency slots held
        return self.prefix + "running"

    @property
    def slots(self) -> str:  # HASH id -> the scopes an active task holds a slot in, "\n"-joined
        return self.prefix + "slots"

    @property
    def lanes(self) -> str:  # ZSET partition -> its last turn: fair partitions (docs/partitions.md)
        return self.prefix + "lanes"

    @property
    def vclock(self) -> str:  # STRING the furthest place in pending a claim took a task from
        return self.prefix + "vclock"

    @property
    def holds(self) -> str:  # HASH task name -> until (ms): types held by a snooze (docs/snooze.md)
        return self.prefix + "holds"

    # Tasks no worker of this release can run (broker/waiting.py): left for one that can
    @property
    def parked(self) -> str:  # ZSET, all scores 0: "<kind>\0<pending score>\0<id>" of tasks left waiting
        return self.prefix + "parked"

    @property
    def parked_kinds(self) -> str:  # HASH kind -> JSON {"since": ms, "reason": text}
        return self.prefix + "parked_kinds"

    # The transactional outbox (django_rtq/outbox.py)
    @property
    def outboxed(self) -> str:  # ZSET id -> when (ms) the outbox first sent it: a re-send is a no-op
        return self.prefix + "outboxed"

    # Forgetting a queue nothing uses (broker/forgetting.py)
    @property
    def empty_since(self) -> str:  # STRING: since when (ms) a janitor has found the queue unused
        return self.prefix + "empty_since"

    def bulk_lock(self, job_id: str) -> str:  # STRING held by whoever is carrying a bulk job on
        return f"{self.prefix}bulk_lock:{job_id}"

    # Workflows (django_rtq.workflows): a workflow lives in its queue like a task, in the
    # `waiting` state, with two keys of its own until it finishes.
    def workflow(self, workflow_id: str) -> str:  # HASH: kind, counters, children's specs
        return f"{self.prefix}wf:{workflow_id}"

    def workflow_results(self, workflow_id: str) -> str:  # HASH position -> child's result JSON
        return f"{self.prefix}wf:{workflow_id}:results"

    # Commands: changes one slot asks of another (a child finished, a step to start),
    # applied by a worker with a dedupe check in the target slot, then removed here.
    @property
    def commands(self) -> str:  # ZSET command id -> when it is due (ms)
        return self.prefix + "commands"

    @property
    def command(self) -> str:  # HASH command id -> command JSON
        return self.prefix + "command"

    @property
    def applied(self) -> str:  # ZSET command id -> applied at (ms): the dedupe record
        return self.prefix + "applied"

    @property
    def columns(self) -> tuple[str, ...]:
        return (
            self.msg,
            self.state,
            self.info,
            self.result,
            self.owner,
            self.priority,
            self.progress,
            self.runs,
        )

    def unique(self, unique_key: str) -> str:  # STRING -> id of the task holding the lock
        return f"{self.prefix}unique:{unique_key}"

    def debounce(self, debounce_key: str) -> str:  # STRING -> id of the debounced copy that waits
        return f"{self.prefix}debounce:{debounce_key}"

    def processed(self, day: str) -> str:  # STRING counter of attempts finished on a UTC day
        return f"{self.prefix}processed:{day}"

    def failed(self, day: str) -> str:  # STRING counter of attempts failed on a UTC day
        return f"{self.prefix}failed:{day}"

    def snoozed(self, day: str) -> str:  # STRING counter of snoozes on a UTC day
        return f"{self.prefix}snoozed:{day}"

    def state_set(self, state: str) -> str:
        return self.prefix + str(state)


class Keyspace:
    """The key names under one prefix."""

    def __init__(self, prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self.prefix = prefix
        self.queues = f"{prefix}:queues"  # SET of queue names enqueued to (until forgotten)
        self.workers = f"{prefix}:workers"  # ZSET worker id -> heartbeat expiry (ms)
        self.cancel_channel = f"{prefix}:cancel"  # pub/sub channel of task ids to cancel
        # HASH "<task>\1<signature fingerprint>" -> last seen (ms): the handler signatures that
        # processes enqueueing or running each task type have (broker/waiting.py)
        self.signatures = f"{prefix}:signatures"
        # ZSET queue -> when (ms) it was forgotten: queues left out of `queues` lately, which the
        # janitors look at again for a while in case a task came meanwhile (broker/forgetting.py)
        self.forgotten = f"{prefix}:forgotten"
        # STRING, with a TTL: the id of the worker whose turn it is to prune the ORM mirror; no
        # other prunes until it expires (django_rtq/worker/pruner.py)
        self.mirror_prune_turn = f"{prefix}:mirror_prune_turn"

    def queue_prefix(self, queue: str) -> str:
        return f"{self.prefix}:{{{queue}}}:"

    def queue(self, queue: str) -> QueueKeys:
        return _queue_keys(self.prefix, queue)

    def worker(self, worker_id: str) -> str:  # STRING JSON of a worker's info, with a TTL
        return f"{self.prefix}:worker:{worker_id}"

    def server_marker(self, tag: str | None = None) -> str:
        """STRING: the run_id of the Redis server it was written under, kept while the server
        keeps its data (broker/redis_config.py); on a Cluster one per master, in the slot of `tag`."""
        return f"{self.prefix}:server-marker" + (f":{{{tag}}}" if tag else "")


@cache
def _queue_keys(prefix: str, queue: str) -> QueueKeys:
    return QueueKeys(name=queue, prefix=f"{prefix}:{{{queue}}}:")

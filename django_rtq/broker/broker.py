"""The broker: every task-state change as one atomic Lua step in its queue's slot.

Longer than the package's other modules on purpose: `Broker` has one method per Lua script,
each building its script's KEYS and ARGV and reading its reply, as asynq's rdb.go does, so the
module grows with the scripts and is read a method at a time. What is not a script's caller
lives elsewhere: the value types a claim returns and a settle takes (`claims.py`), which
errors pass by themselves (`errors.py`), key names (`keys.py`), reads (`inspect.py`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import redis
import redis.cluster

from ..defaults import DEFAULT_KEY_PREFIX, DEFAULT_LEASE_SECONDS, DEFAULT_STATS_TTL_SECONDS
from ..exceptions import DuplicateTask, TaskIdConflict
from .attempt import parse_info
from .claims import (
    KIND_SEPARATOR,
    NO_ABILITIES,
    PARKED_BASE,
    Abilities,
    Claimed,
    ClaimedTask,
    Completion,
    read_claim_notes,
)
from .clock import ServerClock
from .errors import passes_by_itself, translate_errors
from .keys import Keyspace, QueueKeys
from .lane import ScriptLane
from .limits import LimitsSource, no_limits
from .message import TaskMessage
from .scripts import load_scripts
from .states import TaskState

logger = logging.getLogger(__name__)

#: Tasks sent in one enqueue script call; a bulk enqueue is atomic per chunk.
ENQUEUE_CHUNK = 1000
#: What `send_outboxed` reports of each task (send_outboxed.lua's codes).
OUTBOX_SENT, OUTBOX_SENT_BEFORE, OUTBOX_DROPPED = 0, 1, 2
#: Tasks a bounded script (forward, trim) moves per call.
BATCH_LIMIT = 100
#: Seconds a process trusts its own registration of a queue in `rtq:queues` before it makes it
#: again: a registry emptied (FLUSHDB, a Redis restarted without persistence) heals this long
#: after, at the next enqueue to the queue.
QUEUE_REGISTRATION_SECONDS = 60.0
#: One script call: the script's name, its KEYS, its ARGV.
ScriptCall = tuple[str, Sequence[str], Sequence[Any]]


def utc_day(epoch_seconds: float) -> str:
    """Return the UTC date, as YYYY-MM-DD, of an epoch time (per-day counters are keyed by it)."""
    return _day_name(int(epoch_seconds // 86400))


@functools.lru_cache(maxsize=8)
def _day_name(day_number: int) -> str:
    return datetime.fromtimestamp(day_number * 86400, UTC).strftime("%Y-%m-%d")


class Broker:
    """Atomic operations on the task states in Redis. Knows nothing of Django.

    `client` is a redis-py `Redis` or `RedisCluster` with `decode_responses=True`.
    `clock` returns the current epoch time in seconds; tests inject their own. Without one,
    every time decision is taken on the Redis server's clock, so hosts whose clocks disagree
    still agree: the scripts that reckon leases and forward due tasks read TIME themselves, and
    the times Python computes come from a `ServerClock` (clock.py).
    """

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = DEFAULT_KEY_PREFIX,
        clock: Callable[[], float] | None = None,
        counter_ttl: float = DEFAULT_STATS_TTL_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        mirror: bool = False,
    ) -> None:
        self.client = client
        # Script calls go on each thread's own connection where the client's pool allows (lane.py).
        self.lane = ScriptLane(client)
        # Keep finished tasks' records in a buffer for the ORM mirror (see take_finished).
        self.mirror = mirror
        # Handing tasks to idle workers at enqueue relies on PUBLISH counting the clients that
        # got the message. On a cluster it counts one node's while every node delivers it, so
        # there idle workers are only woken, and claim.
        self.hands_off = not isinstance(client, redis.cluster.RedisCluster)
        self.lease_ms = int(lease_seconds * 1000)
        self.keys = Keyspace(prefix)
        self._clock: Callable[[], float] = clock or ServerClock(client)
        self.server_clock = clock is None  # the scripts read the Redis server's TIME themselves
        self.counter_ttl = int(counter_ttl)
        self.scripts = load_scripts()
        self._registered_at: dict[str, float] = {}  # queue -> when this process registered it
        # The flow-control limits in force (broker/limits.py): the Django side passes the project's.
        self.limits: LimitsSource = no_limits

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        """Use another clock (a test's): leases too are then reckoned on it."""
        self._clock = clock
        self.server_clock = False

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def clock_arg(self) -> int:
        """The `now` argument of a script that reads TIME itself: 0 for the server's clock."""
        return 0 if self.server_clock else self.now_ms()

    def server_now_ms(self) -> int:
        """The time (ms) leases are reckoned in: the Redis server's clock, or the injected one."""
        if not self.server_clock:
            return self.now_ms()
        with translate_errors():
            seconds, microseconds = self.client.time()
        return int(seconds) * 1000 + int(microseconds) // 1000

    # Running scripts

    def run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self.scripts[name]
        with translate_errors():
            try:
                return self.lane.execute("EVALSHA", script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                # EVAL caches the script on the node that runs it, so later EVALSHAs find it.
                return self.client.eval(script.source, len(keys), *keys, *args)

    def _run_pipelined(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in one round trip (not atomically across calls); raise the first
        call's error."""
        if not calls:
            return []
        if len(calls) == 1:
            return [self.run_script(*calls[0])]
        results = self._execute_scripts(calls)
        for result in results:
            if isinstance(result, Exception):
                with translate_errors():
                    raise result
        return results

    def _run_each(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run several scripts in one round trip; a call's error is its reply, not raised, but
        for errors that mean Redis is away (BrokerUnavailable)."""
        if not calls:
            return []
        if len(calls) == 1:  # the common case: no pipeline to build
            try:
                return [self.run_script(*calls[0])]
            except redis.ResponseError as exc:  # BrokerUnavailable passes
                return [exc]
        results = self._execute_scripts(calls)
        for result in results:
            if isinstance(result, Exception) and passes_by_itself(result):
                with translate_errors():
                    raise result
        return results

    def _execute_scripts(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Each call's reply, or its error, from one pipelined round trip; a script missing from
        the node's cache is sent whole and run again."""
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for name, keys, args in calls:
                # By command name: redis-py's cluster pipeline refuses its evalsha() method.
                pipe.execute_command("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args)
            results = pipe.execute(raise_on_error=False)
            for i, result in enumerate(results):
                if isinstance(result, redis.exceptions.NoScriptError):
                    name, keys, args = calls[i]
                    try:
                        results[i] = self.client.eval(self.scripts[name].source, len(keys), *keys, *args)
                    except redis.ResponseError as exc:
                        results[i] = exc
        return results

    def queue(self, name: str) -> QueueKeys:
        return self.keys.queue(name)

    # Enqueueing

    def enqueue(self, messages: Sequence[TaskMessage]) -> dict[int, str]:
        """Enqueue tasks in one round trip; return, for each debounced task merged into the copy
        that waits (docs/debounce.md), its index in `messages` and that copy's id.

        Raises TaskIdConflict if a task's id exists, DuplicateTask if a unique task's lock is
        held. Each chunk of ENQUEUE_CHUNK tasks of a queue is all or nothing: the chunk holding
        that task is not written, the others are. The queues are registered first: a registry
        that refuses (a wrong-typed key) raises with nothing written.
        """
        self.register_queues({message.queue for message in messages})
        merged: dict[int, str] = {}
        for chunk, (code, *rest) in self._send("enqueue", messages, self._run_pipelined):
            if code:
                raise _enqueue_refused(code, messages[chunk[rest[0] - 1]])
            for k in range(0, len(rest), 2):
                merged[chunk[int(rest[k]) - 1]] = rest[k + 1]
        return merged

    def send_outboxed(self, messages: Sequence[TaskMessage]) -> list[int | Exception]:
        """Send tasks from the transactional outbox, in one round trip; each one stands alone.

        Return one outcome per message, in order: OUTBOX_SENT; OUTBOX_SENT_BEFORE (its id exists,
        or the outbox sent it before: nothing written); OUTBOX_DROPPED (its uniqueness lock is
        held); or the error of the script call that carried it (wrong-typed keys, say). Raises
        BrokerUnavailable if Redis is away: then some chunks may be written and others not, and
        sending them all again is safe.
        """
        try:
            self.register_queues({message.queue for message in messages})
        except redis.ResponseError as exc:  # a wrong-typed registry: nothing sent, each says why
            return [exc] * len(messages)
        outcomes: list[int | Exception] = [0] * len(messages)
        for chunk, reply in self._send("send_outboxed", messages, self._run_each):
            for position, i in enumerate(chunk):
                outcomes[i] = reply if isinstance(reply, Exception) else int(reply[position])
        return outcomes

    def _send(
        self,
        script: str,
        messages: Sequence[TaskMessage],
        run: Callable[[Sequence[ScriptCall]], list[Any]],
    ) -> Iterator[tuple[list[int], Any]]:
        """Write tasks with `script` (enqueue, or send_outboxed: the same arguments, one key
        more), one call per chunk of ENQUEUE_CHUNK tasks of a queue, all in the one round trip
        of `run`; return each chunk's indexes in `messages` with its call's reply."""
        clock_arg = self.clock_arg()
        if len(messages) == 1:  # the common case: nothing to group or cut
            qk = self.queue(messages[0].queue)
            handoff = self.handoff_prefix(qk, (messages[0].task,))
            calls = [self._send_call(script, qk, messages, clock_arg, handoff)]
            chunks = [[0]]
        else:
            by_queue: dict[str, list[int]] = defaultdict(list)
            for index, message in enumerate(messages):
                by_queue[message.queue].append(index)
            calls, chunks = [], []
            for queue, indexes in by_queue.items():
                qk = self.queue(queue)
                handoff = self.handoff_prefix(qk, (messages[i].task for i in indexes))
                for start in range(0, len(indexes), ENQUEUE_CHUNK):
                    chunk = indexes[start : start + ENQUEUE_CHUNK]
                    calls.append(
                        self._send_call(script, qk, [messages[i] for i in chunk], clock_arg, handoff)
                    )
                    chunks.append(chunk)
        return zip(chunks, run(calls), strict=True)

    def _send_call(
        self, script: str, qk: QueueKeys, messages: Iterable[TaskMessage], clock_arg: int, handoff: str
    ) -> ScriptCall:
        """One call of enqueue.lua or send_outboxed.lua with these tasks of one queue (see their
        headers)."""
        keys = list(qk.enqueue_keys) if script == "enqueue" else [*qk.enqueue_keys, qk.outboxed]
        args: list[Any] = [clock_arg, qk.wake_channel, handoff, self.lease_ms]
        for message in messages:
            unique_index = 0
            if message.unique_key:
                keys.append(qk.unique(message.unique_key))
                unique_index = len(keys)
            elif message.debounce_key and message.debounce:
                keys.append(qk.debounce(message.debounce_key))
                unique_index = -len(keys)  # the scripts' mark of a debounced task
            args += _enqueue_args(message, unique_index)
        return script, keys, args

    def outboxed_before(self, starts: dict[str, int], before_ms: int, *, limit: int) -> dict[str, list[str]]:
        """The ids each queue's `outboxed` set has held since before `before_ms`, oldest first,
        from position `starts[queue]` on (up to `limit` per queue): for the relay to forget those
        whose outbox rows are gone."""
        queues = list(starts)
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                key = self.queue(queue).outboxed
                pipe.zrangebyscore(key, "-inf", f"({before_ms}", start=starts[queue], num=limit)
            replies = pipe.execute(raise_on_error=False)
        # A queue whose key is of the wrong type has nothing to forget: its sends report it.
        found = zip(queues, replies, strict=True)
        return {queue: ids for queue, ids in found if isinstance(ids, list) and ids}

    def forget_outboxed(self, ids_by_queue: dict[str, Sequence[str]]) -> None:
        if not ids_by_queue:
            return
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for queue, ids in ids_by_queue.items():
                pipe.zrem(self.queue(queue).outboxed, *ids)
            pipe.execute(raise_on_error=False)

    def enqueue_periodic(self, message: TaskMessage, *, schedule: str, tick_ms: int) -> str:
        """Enqueue the task of one tick of a periodic schedule, once however many workers ask.

        Return what happened: "enqueued"; "done" (this tick or a later one was dealt with
        already); "armed" (the schedule's first tick seen: recorded, not enqueued); "exists" (the
        task id is taken) or "locked" (the task's uniqueness lock is held), both recorded.
        """
        qk = self.queue(message.queue)
        keys = [
            qk.msg,
            qk.state,
            qk.priority,
            qk.pending,
            qk.scheduled,
            qk.seq,
            qk.active,
            qk.owner,
            qk.idle,
            qk.paused,
            qk.periodic,
            qk.runs,
            qk.holds,
            qk.lanes,
            qk.vclock,
        ]
        if message.unique_key:
            keys.append(qk.unique(message.unique_key))
        unique_ttl_ms = int((message.unique_ttl or 0) * 1000)
        args = [
            self.clock_arg(),
            qk.wake_channel,
            self.handoff_prefix(qk, [message.task]),
            self.lease_ms,
        ]
        args += [schedule, tick_ms, message.id, message.to_json(), message.priority, unique_ttl_ms]
        self.register_queues([message.queue])
        code = self.run_script("enqueue_periodic", keys, args)
        return ("done", "enqueued", "armed", "exists", "locked")[code]

    def handoff_prefix(self, qk: QueueKeys, tasks: Iterable[str]) -> str:
        """The hand-off argument of a script that enqueues tasks of these types to a queue: ""
        (hand none to an idle worker) when a limit may hold one back, since only a claim applies
        limits."""
        limits = self.limits()
        if limits and any(limits.holds(qk.name, task) for task in tasks):
            return ""
        return qk.handoff_prefix

    def periodic_ticks(self, queue: str) -> dict[str, int]:
        """Return the last tick (ms) dealt with of each periodic schedule of a queue."""
        with translate_errors():
            return {name: int(tick) for name, tick in self.client.hgetall(self.queue(queue).periodic).items()}

    def register_queues(self, queues: Iterable[str]) -> None:
        """Add queues to the registry of queues ever enqueued to (`rtq:queues`), before their
        tasks are written; once per QUEUE_REGISTRATION_SECONDS per queue and process.

        The registry is a global key (another Cluster slot than the queue's), so it cannot be
        written in the enqueue script's atomic step; registering first makes a refusal leave
        nothing written, and a queue registered whose task was then refused is harmless."""
        now = self._clock()  # a registration "from the future" (a clock set back) is due too
        due = [
            queue
            for queue in queues
            if not 0 <= now - self._registered_at.get(queue, -math.inf) < QUEUE_REGISTRATION_SECONDS
        ]
        if due:
            with translate_errors():
                self.client.sadd(self.keys.queues, *due)
            self._registered_at.update(dict.fromkeys(due, now))

    def add_timings(self, timings: dict[str, dict[str, float]]) -> None:
        """Add a worker's counts to the queues' timings histograms (broker/timings.py), pipelined."""
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for queue, fields in timings.items():
                key = self.queue(queue).timings
                for name, value in fields.items():
                    pipe.hincrbyfloat(key, name, value)
            pipe.execute()

    def timings(self, queue: str) -> dict[str, str]:
        """The raw timings hash of a queue (broker/timings.py reads it)."""
        with translate_errors():
            return self.client.hgetall(self.queue(queue).timings)

    def known_queues(self) -> list[str]:
        with translate_errors():
            return sorted(self.client.smembers(self.keys.queues))

    # Claiming and settling (the processor's hot path)

    def claim(
        self,
        queue: str,
        *,
        worker_id: str,
        limit: int,
        start_now: int | None = None,
        idle_for_ms: int = 0,
        abilities: Abilities = NO_ABILITIES,
    ) -> Claimed:
        """Claim up to `limit` pending tasks of a queue under a lease held by `worker_id`.

        The first `start_now` (all by default) start at once; the others are marked unstarted
        until `extend_leases` reports their start. With `idle_for_ms`, a worker that gets fewer
        than `limit` is registered as idle that long: the next task enqueued to the empty queue
        is handed to it directly. The queue's flow-control limits (`self.limits`) apply: tasks
        they hold back wait, and the result's `wait` says when a rate limit lets one start.
        `abilities` say what the worker's release cannot run (broker/waiting.py): such tasks
        are parked as the claim passes them, and parked ones it can run are taken first.
        """
        qk = self.queue(queue)
        limits = self.limits()
        reply = self.run_script(
            "claim",
            [
                qk.pending,
                qk.active,
                qk.state,
                qk.owner,
                qk.msg,
                qk.info,
                qk.paused,
                qk.idle,
                qk.runs,
                qk.unstarted,
                qk.held,
                qk.buckets,
                qk.running,
                qk.slots,
                qk.parked,
                qk.parked_kinds,
                qk.holds,
                qk.lanes,
                qk.vclock,
                qk.seq,
            ],
            [
                self.clock_arg(),
                self.lease_ms,
                worker_id,
                limit,
                limit if start_now is None else start_now,
                idle_for_ms,
                limits.spec(queue),
                abilities.unknown_types,
                abilities.can_run,
                abilities.cannot_run,
                qk.wake_channel,
            ],
        )
        claimed = Claimed()
        claimed.limits = limits
        notes, thread_bound, wait_ms = reply.pop(), reply.pop(), reply.pop()
        claimed.wait = wait_ms / 1000 if wait_ms >= 0 else None
        claimed.thread_bound = bool(thread_bound)
        refused_by: dict[str, str] = {}
        if notes:
            claimed.unjudged_kinds, refused_by = read_claim_notes(notes)
        for i in range(0, len(reply), 4):
            task_id = reply[i]
            info, problem = parse_info(reply[i + 2])
            if problem:
                logger.warning(
                    "task %r of queue %r: its info is %s; starting from empty info", task_id, queue, problem
                )
            claimed.append(
                ClaimedTask(
                    id=task_id,
                    queue=queue,
                    raw_message=reply[i + 1] or None,
                    info=info,
                    run=str(reply[i + 3]),
                    refused_by=refused_by.get(task_id, ""),
                )
            )
        return claimed

    def park(self, queue: str, *, worker_id: str, entries: Sequence[tuple[str, str, str, str]]) -> int:
        """Leave tasks this worker holds under a claim, and cannot run, for a worker that can:
        `entries` are (task id, run, kind, reason) (broker/waiting.py). Return how many were
        parked (a task whose lease this run lost since is skipped)."""
        qk = self.queue(queue)
        keys = [
            qk.active, qk.owner, qk.unstarted, qk.slots, qk.running, qk.runs, qk.state, qk.priority,
            qk.seq, qk.pending, qk.parked, qk.parked_kinds, qk.began,
        ]  # fmt: skip
        args: list[str | int] = [self.clock_arg(), worker_id, qk.wake_channel]
        for entry in entries:
            args += entry
        return self.run_script("park", keys, args)

    def announce_signatures(self, signatures: Iterable[tuple[str, str]]) -> None:
        """Note that this process binds calls of these task types to these handler signatures
        ((task name, fingerprint) pairs), as of now."""
        now_ms = self.now_ms()
        mapping = {f"{task}{KIND_SEPARATOR}{fingerprint}": now_ms for task, fingerprint in signatures}
        if mapping:
            with translate_errors():
                self.client.hset(self.keys.signatures, mapping=mapping)

    def signatures_of(self, task: str, *, seen_since_ms: int) -> set[str]:
        """The fingerprints of the handler signatures of a task type that processes announced
        since then."""
        with translate_errors():
            seen = self.client.hgetall(self.keys.signatures)
        head = task + KIND_SEPARATOR
        return {
            field[len(head) :]
            for field, at in seen.items()
            if field.startswith(head) and at.isdigit() and int(at) >= seen_since_ms
        }

    def forget_signatures(self, *, seen_before_ms: int) -> int:
        """Forget the signatures announced last before then; return how many."""
        with translate_errors():
            seen = self.client.hgetall(self.keys.signatures)
            stale = [field for field, at in seen.items() if not at.isdigit() or int(at) < seen_before_ms]
            return self.client.hdel(self.keys.signatures, *stale) if stale else 0

    def forget_parked(self, queue: str, *, per_kind: int = 1000) -> int:
        """Tidy a queue's parked tasks: drop the index's entries of tasks no longer parked,
        forget kinds left without one, and note kinds whose facts were lost (forget_parked.lua).
        Return how many entries were dropped."""
        qk = self.queue(queue)
        return self.run_script(
            "forget_parked", [qk.pending, qk.parked, qk.parked_kinds], [per_kind, self.now_ms()]
        )

    def leave_idle(self, queues: Iterable[str], *, worker_id: str) -> None:
        """Stop being handed tasks in these queues (a worker shutting down, or full)."""
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                pipe.zrem(self.queue(queue).idle, worker_id)
            pipe.execute()

    def complete(self, queue: str, completions: Sequence[Completion], *, worker_id: str) -> int:
        """Settle successful attempts; return how many were settled (the others came late:
        a newer run of the task has started, or it is gone)."""
        now_ms = self.now_ms()
        qk = self.queue(queue)
        keys = [
            qk.active,
            qk.owner,
            qk.state,
            qk.msg,
            qk.info,
            qk.result,
            qk.priority,
            qk.completed,
            qk.processed(utc_day(now_ms / 1000)),
            qk.finished,
            qk.progress,
            qk.commands,
            qk.command,
            qk.runs,
            qk.unstarted,
            qk.pending,
            qk.retry,
            qk.slots,
            qk.running,
            qk.began,
        ]
        args: list[Any] = [now_ms, worker_id, self.counter_ttl, int(self.mirror), qk.wake_channel]
        for done in completions:
            unique_index = 0
            if done.unique_key:
                keys.append(qk.unique(done.unique_key))
                unique_index = len(keys)
            if done.times and not done.info:
                info = f"{done.times[0]!r},{done.times[1]!r}"
            else:
                info = _dumps(done.info)
            args += [done.id, done.run, info, done.result_json, done.retention_ms, unique_index, done.notify]
        return self.run_script("complete", keys, args)

    def fail(
        self,
        queue: str,
        task_id: str,
        *,
        worker_id: str,
        run: str,
        to: TaskState,
        retry_at_ms: int = 0,
        info: dict[str, Any],
        unique_key: str | None = None,
    ) -> bool:
        """Move a failed task to retry (at `retry_at_ms`) or archived; return False when the
        result came late (a newer run of the task has started, or it is gone)."""
        if to not in (TaskState.RETRY, TaskState.ARCHIVED):
            raise ValueError(f"A failed task goes to retry or archived, not {to}.")
        now_ms = self.now_ms()
        qk = self.queue(queue)
        day = utc_day(now_ms / 1000)
        keys = [
            qk.active,
            qk.owner,
            qk.state,
            qk.info,
            qk.retry,
            qk.archived,
            qk.processed(day),
            qk.failed(day),
            qk.msg,
            qk.finished,
            qk.progress,
            qk.commands,
            qk.command,
            qk.runs,
            qk.unstarted,
            qk.pending,
            qk.slots,
            qk.running,
            qk.began,
        ]
        if unique_key:
            keys.append(qk.unique(unique_key))
        score = retry_at_ms if to == TaskState.RETRY else now_ms
        args = [task_id, worker_id, run, str(to), score, _dumps(info), self.counter_ttl, int(self.mirror)]
        args.append(qk.wake_channel)
        return self.run_script("fail", keys, args) == 1

    def requeue(self, queue: str, task_ids: Sequence[str], *, worker_id: str) -> int:
        """Return active tasks held by `worker_id` to the front of pending, uncounted."""
        if not task_ids:
            return 0
        qk = self.queue(queue)
        return self.run_script(
            "requeue",
            [
                qk.active,
                qk.owner,
                qk.state,
                qk.priority,
                qk.pending,
                qk.seq,
                qk.unstarted,
                qk.slots,
                qk.running,
                qk.began,
            ],
            [worker_id, qk.wake_channel, *task_ids],
        )

    def extend_leases(self, queue: str, tasks: Sequence[tuple[str, bool]], *, worker_id: str) -> int:
        """Renew the worker's leases on (task id, started) pairs for another `lease_ms`, and
        record the start of those that have started; return how many it still held."""
        if not tasks:
            return 0
        qk = self.queue(queue)
        args: list[Any] = [self.clock_arg(), self.lease_ms, worker_id]
        for task_id, started in tasks:
            args += [task_id, int(started)]
        return self.run_script("extend_leases", [qk.active, qk.owner, qk.unstarted, qk.runs, qk.began], args)

    # Housekeeping (forwarder, recoverer, janitor)

    def forward(self, queue: str, *, limit: int = BATCH_LIMIT) -> int:
        """Move due scheduled and retry tasks to pending; return how many moved."""
        qk = self.queue(queue)
        moved = 0
        for source in (qk.scheduled, qk.retry):
            while True:
                count = self.run_script(
                    "forward",
                    [source, qk.state, qk.priority, qk.pending, qk.seq, qk.msg, qk.lanes, qk.vclock],
                    [self.clock_arg(), limit, qk.wake_channel],
                )
                moved += count
                if count < limit:
                    break
        return moved

    def recover(
        self, queue: str, *, grace_ms: int, max_recoveries: int, limit: int = BATCH_LIMIT
    ) -> list[tuple[str, str]]:
        """Take back up to `limit` tasks whose lease expired more than `grace_ms` ago; return
        (id, outcome) pairs, outcome being "requeued", "recovered" or "archived" (recover.lua)."""
        qk = self.queue(queue)
        cutoff_ms = self.server_now_ms() - grace_ms
        with translate_errors():
            ids = self.client.zrange(qk.active, "-inf", f"({cutoff_ms}", byscore=True, offset=0, num=limit)
            if not ids:
                return []
            messages = self.client.hmget(qk.msg, ids)
        keys = [
            qk.active,
            qk.owner,
            qk.state,
            qk.info,
            qk.msg,
            qk.pending,
            qk.seq,
            qk.priority,
            qk.runs,
            qk.unstarted,
            qk.archived,
            qk.finished,
            qk.progress,
            qk.commands,
            qk.command,
            qk.slots,
            qk.running,
            qk.began,
        ]
        args: list[Any] = [self.clock_arg(), grace_ms, max_recoveries, int(self.mirror), qk.wake_channel]
        for task_id, raw in zip(ids, messages, strict=True):
            unique_index = 0
            unique_key = _unique_key_of(raw)
            if unique_key:
                keys.append(qk.unique(unique_key))
                unique_index = len(keys)
            args += [task_id, unique_index]
        reply = self.run_script("recover", keys, args)
        return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]

    def trim(
        self,
        queue: str,
        *,
        archive_max_age_ms: int,
        archive_max_size: int,
        limit: int = BATCH_LIMIT,
    ) -> int:
        """Delete completed tasks past retention and archived ones past the archive's bounds."""
        qk = self.queue(queue)
        deleted = 0
        while True:
            now_ms = self.now_ms()
            count = self.run_script(
                "trim",
                [
                    qk.completed,
                    qk.archived,
                    qk.msg,
                    qk.state,
                    qk.info,
                    qk.result,
                    qk.priority,
                    qk.progress,
                    qk.runs,
                ],
                [now_ms, now_ms - archive_max_age_ms, archive_max_size, limit],
            )
            deleted += count
            if count < limit:
                return deleted

    def is_drained(self, queues: Iterable[str]) -> bool:
        """Tell whether the queues have nothing pending, nor scheduled or retry tasks due."""
        now_ms = self.now_ms()
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                qk = self.queue(queue)
                pipe.zcount(qk.pending, "-inf", f"({PARKED_BASE}")  # not those left for other releases
                pipe.zcount(qk.scheduled, "-inf", now_ms)
                pipe.zcount(qk.retry, "-inf", now_ms)
            return not any(pipe.execute())

    # The buffer of finished tasks for the ORM mirror

    def take_finished(
        self, queue: str, *, worker_id: str, lock_ms: int, limit: int
    ) -> list[tuple[str, str]] | None:
        """Take (id, record JSON) pairs of finished tasks to mirror; None while another worker
        mirrors this queue. The records stay buffered until `ack_finished`."""
        qk = self.queue(queue)
        reply = self.run_script("take_finished", [qk.mirror_lock, qk.finished], [worker_id, lock_ms, limit])
        if reply is None:
            return None
        return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]

    def ack_finished(
        self, queue: str, records: Sequence[tuple[str, str]], *, worker_id: str, release: bool = False
    ) -> int:
        """Drop mirrored records (each only if unchanged since taken); return how many."""
        qk = self.queue(queue)
        args: list[Any] = [worker_id, int(release)]
        for task_id, record in records:
            args += [task_id, hashlib.sha1(record.encode()).hexdigest()]
        return self.run_script("ack_finished", [qk.mirror_lock, qk.finished], args)

    def finished_backlog(self, queue: str) -> int:
        """How many finished tasks' records of a queue wait to be mirrored."""
        with translate_errors():
            return self.client.hlen(self.queue(queue).finished)

    def finished_records(self, task_id: str, queues: Iterable[str]) -> dict[str, str]:
        """Return {queue: record JSON} of a finished task still waiting to be mirrored."""
        queues = list(queues)
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            for queue in queues:
                pipe.hget(self.queue(queue).finished, task_id)
            found = pipe.execute()
        return {queue: record for queue, record in zip(queues, found, strict=True) if record}

    def take_prune_turn(self, worker_id: str, *, ttl_ms: int) -> bool:
        """Take the turn to prune the ORM mirror for `ttl_ms` (on Redis's clock), unless another
        worker holds it; return whether this one took it. Not released: no one prunes again
        before it expires."""
        with translate_errors():
            return bool(self.client.set(self.keys.mirror_prune_turn, worker_id, nx=True, px=ttl_ms))

    # Queue control and cancellation

    def pause(self, queue: str) -> None:
        with translate_errors():
            self.client.set(self.queue(queue).paused, "1")

    def resume(self, queue: str) -> None:
        qk = self.queue(queue)
        with translate_errors():
            self.client.delete(qk.paused)
            self.client.publish(qk.wake_channel, "1")

    def is_paused(self, queue: str) -> bool:
        with translate_errors():
            return bool(self.client.exists(self.queue(queue).paused))

    def request_cancel(self, task_id: str) -> int:
        """Ask whichever worker runs the task to stop it; return how many workers listened."""
        with translate_errors():
            return self.client.publish(self.keys.cancel_channel, task_id)

    # Worker registry

    def write_worker(self, worker_id: str, info: dict[str, Any], *, ttl_seconds: float) -> None:
        expiry_ms = self.now_ms() + int(ttl_seconds * 1000)
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self.keys.worker(worker_id), _dumps(info), px=int(ttl_seconds * 1000))
            pipe.zadd(self.keys.workers, {worker_id: expiry_ms})
            pipe.execute()

    def remove_worker(self, worker_id: str) -> None:
        with translate_errors():
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(self.keys.worker(worker_id))
            pipe.zrem(self.keys.workers, worker_id)
            pipe.execute()

    def workers(self) -> list[dict[str, Any]]:
        """Return the info of every worker whose heartbeat is current."""
        with translate_errors():
            self.client.zremrangebyscore(self.keys.workers, "-inf", self.now_ms())
            ids = self.client.zrange(self.keys.workers, 0, -1)
            if not ids:
                return []
            pipe = self.client.pipeline(transaction=False)
            for worker_id in ids:
                pipe.get(self.keys.worker(worker_id))
            raws = pipe.execute()
        return [json.loads(raw) for raw in raws if raw]

    def ping(self) -> bool:
        with translate_errors():
            return bool(self.client.ping())


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _unique_key_of(raw_message: str | None) -> str | None:
    """The uniqueness key of a stored message, or None (also for a message that is corrupt)."""
    try:
        key = json.loads(raw_message).get("unique_key") if raw_message else None
    except (ValueError, AttributeError):
        return None
    return key if isinstance(key, str) else None


def _enqueue_args(message: TaskMessage, unique_index: int) -> tuple[Any, ...]:
    """The six arguments of one task to the enqueue script (see its header): for a debounced
    one (`unique_index` < 0), its window in place of the unique lock's TTL."""
    if unique_index < 0:
        lock_ms = max(1, round((message.debounce or 0) * 1000))
    else:
        lock_ms = int(message.unique_ttl * 1000) if message.unique_ttl else 0  # 0: no expiry
    return (
        message.id,
        message.to_json(),
        message.priority,
        int(message.process_at * 1000) if message.process_at else 0,
        unique_index,
        lock_ms,
    )


def _enqueue_refused(code: int, message: TaskMessage) -> Exception:
    """The error of an enqueue script's reply {code, index}, for the task at that index."""
    if code == 1:
        return TaskIdConflict(f"A task with id {message.id!r} already exists in queue {message.queue!r}.")
    return DuplicateTask(
        f"Task {message.task!r} with unique key {message.unique_key!r} is already queued "
        f"in queue {message.queue!r}."
    )


__all__ = ["Broker", "utc_day"]

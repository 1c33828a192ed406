"""Forgetting queues nothing uses: out of the registry of queues (`rtq:queues`), their leftovers deleted.

A queue's keys are in its own slot and the registry in another, so no one script can check that
a queue is unused and take it out of the registry. `forget_queue.lua` checks and deletes the
leftovers in the queue's slot; the name then leaves the registry, and is noted in `rtq:forgotten`
for RECHECK_MS, during which the janitors look at the queue again and put it back once a task is
in it. A process trusts its own registration of a queue for QUEUE_REGISTRATION_SECONDS (it does
not send it again at each enqueue), so a process that registered it just before it was forgotten
may enqueue to it unregistered until then: the looks again find that task. After that, every
enqueue registers the queue again first.
"""

from __future__ import annotations

from collections.abc import Iterable

from .broker import QUEUE_REGISTRATION_SECONDS, Broker
from .errors import translate_errors
from .workflow import APPLIED_TTL_MS

#: How long (ms) after forgetting a queue the janitors look at it again: twice as long as a
#: process trusts its own registration of a queue.
RECHECK_MS = int(2 * QUEUE_REGISTRATION_SECONDS * 1000)
#: What forget_queue.lua answers: in use (with what uses it); unused, kept (within its grace);
#: forgotten (its leftovers deleted; the caller takes it out of the registry).
IN_USE, UNUSED, FORGOTTEN = 0, 1, 2

#: Why a queue is in use, by the key forget_queue.lua names; a state set's name reads "holds
#: <state> tasks".
_USES = {
    "state": "it holds tasks",
    "msg": "it holds tasks",
    "held": "it holds tasks held back by flow control",
    "parked": "it holds tasks waiting for a worker that can run them",
    "unstarted": "it holds tasks claimed by a worker",
    "waiting": "it holds waiting workflows",
    "commands": "workflow commands for it are under way",
    "command": "workflow commands for it are under way",
    "applied": "it applied workflow commands within the hour",
    "finished": "finished tasks of it wait to be written to the ORM mirror",
    "bulk": "a bulk action on it is unfinished (rtq_bulk shows it)",
    "outboxed": "the outbox still remembers tasks it sent to it (a relay forgets them a while after)",
    "paused": "it is paused (rtq_resume it first)",
    "idle": "a live worker serves it",
}


def why_in_use(user: str) -> str:
    """A sentence's end saying what uses a queue, from the key name forget_queue.lua gave."""
    return _USES.get(user, f"it holds {user} tasks")


def forget_queue(broker: Broker, queue: str, *, grace_ms: int) -> tuple[int, str]:
    """Run forget_queue.lua: (IN_USE, the key name of what uses the queue), (UNUSED, "") or
    (FORGOTTEN, ""). A negative `grace_ms` only tells whether the queue is in use."""
    reply = broker.run_script(
        "forget_queue", broker.queue(queue).forget_keys, [broker.clock_arg(), grace_ms, APPLIED_TTL_MS]
    )
    return int(reply[0]), str(reply[1]) if len(reply) > 1 else ""


def forget_unused(broker: Broker, queues: Iterable[str], *, grace_ms: int) -> list[str]:
    """Forget each of `queues` that nothing has used for `grace_ms` as the janitors saw it (0:
    if nothing uses it now); return those forgotten."""
    forgotten = []
    for queue in queues:
        outcome, _ = forget_queue(broker, queue, grace_ms=grace_ms)
        if outcome == FORGOTTEN:
            _unregister(broker, queue)
            forgotten.append(queue)
    return forgotten


def forget_now(broker: Broker, queue: str) -> str:
    """Forget a queue if nothing uses it now; return "" if it was, or what uses it (a sentence's
    end, see why_in_use)."""
    outcome, user = forget_queue(broker, queue, grace_ms=0)
    if outcome == IN_USE:
        return why_in_use(user)
    _unregister(broker, queue)
    return ""


def _unregister(broker: Broker, queue: str) -> None:
    """Take a queue forget_queue.lua forgot out of the registry, noting it for the looks again
    (first: a failure between the two leaves it listed, which is harmless); then look at once,
    for a task enqueued since the script ran."""
    with translate_errors():
        broker.client.zadd(broker.keys.forgotten, {queue: broker.now_ms()})
        broker.client.srem(broker.keys.queues, queue)
    _look_again(broker, queue)


def look_again(broker: Broker) -> list[str]:
    """Put each queue forgotten within RECHECK_MS that is in use again back in the registry, and
    stop looking at the others once RECHECK_MS passed; return the queues put back."""
    with translate_errors():
        entries = broker.client.zrange(broker.keys.forgotten, 0, -1, withscores=True)
    now = broker.now_ms()
    back = []
    for queue, forgotten_at in entries:
        if _look_again(broker, queue):
            back.append(queue)
        elif now - forgotten_at >= RECHECK_MS:
            with translate_errors():
                broker.client.zrem(broker.keys.forgotten, queue)
    return back


def _look_again(broker: Broker, queue: str) -> bool:
    """Register a forgotten queue again if it is in use; return whether it was."""
    outcome, _ = forget_queue(broker, queue, grace_ms=-1)
    if outcome != IN_USE:
        return False
    with translate_errors():
        broker.client.sadd(broker.keys.queues, queue)
        broker.client.zrem(broker.keys.forgotten, queue)
    return True

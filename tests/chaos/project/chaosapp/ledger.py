"""A handler's run, recorded twice: its start and end lines (chaosapp/runs.py), and the facts of
the run pushed on a Redis list (CHAOS_LEDGER) for the checks: the task's key, the code that ran
it (`ran_by`: a release or a project), its arguments, its process, worker and attempt facts, and
how many times it had been claimed (its `runs` counter)."""

import json
import os
import time

from chaosapp.runs import record
from django_rtq import current_task, get_broker

#: Calls numbered below this are a steady stream whose runs keep a worker busy; from it on, batches.
STREAM_END = 1000


def seconds_for(i: int) -> float:
    """How long the run of call number `i` takes: 0.2-0.5 s in the stream, 10 ms in a batch."""
    return 0.2 + 0.1 * (i % 4) if i < STREAM_END else 0.01


def run(key: str, ran_by: str, seconds: float, arguments: dict) -> str:
    """Sleep `seconds` between a recorded start and a recorded end, and record the run's facts
    just before its end; `key` names the task. An exception records `abort` instead of `end`."""
    record("start", key)
    try:
        time.sleep(seconds)
        _note(key, ran_by, arguments)
        record("end", key)
    except BaseException:
        record("abort", key)
        raise
    return key


def _note(key: str, ran_by: str, arguments: dict) -> None:
    context = current_task()
    broker = get_broker()
    claims = broker.client.hget(broker.queue(context.queue).runs, context.id)
    facts = {
        "key": key,
        "ran_by": ran_by,
        "args": arguments,
        "pid": os.getpid(),
        "id": context.id,
        "task": context.task,
        "worker": context.worker_id,
        "retried": context.retried,
        "requeued": context.info.get("requeued", 0),
        "recovered": context.info.get("recovered", 0),
        "snoozed": context.info.get("snoozed", 0),
        "claims": int(claims or 0),
    }
    broker.client.rpush(os.environ["CHAOS_LEDGER"], json.dumps(facts))

"""The chaos project's tasks: `chaos_sleep`, `chaos_steps` and `chaos_api_call`, Django's own
`@task`, and `chaos_receipt` and `chaos_backfill`, django-rtq's `@task` (an order's receipt,
enqueued on commit; a backfill over every order, resumable); no options."""

import json
import os
import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport offers the same API
    from django_tasks import task

from chaosapp import ledger
from chaosapp.models import Order
from chaosapp.runs import record
from django_rtq import Snooze, current_task, get_broker
from django_rtq import task as rtq_task
from django_rtq.checkpoints import iterate_queryset

#: The longest sleep of `chaos_steps`.
STEP_SECONDS = 0.05


@task
def chaos_sleep(key, ms):
    """Sleep `ms` milliseconds between a recorded start and a recorded end; `key` names the run.
    A run interrupted by an exception (a worker cancelling it, say) records `abort` instead."""
    record("start", key)
    try:
        time.sleep(ms / 1000)
        record("end", key)
    except BaseException:
        record("abort", key)
        raise
    return key


@task
def chaos_steps(key, ms):
    """`chaos_sleep` in sleeps of STEP_SECONDS: a handler the worker's watchdog stops at once (its
    exception lands between two sleeps), where one long `time.sleep` is C code it waits out."""
    record("start", key)
    try:
        until = time.monotonic() + ms / 1000
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, STEP_SECONDS))
        record("end", key)
    except BaseException:
        record("abort", key)
        raise
    return key


@rtq_task
def chaos_receipt(key, ms):
    """The same recorded sleep as `chaos_sleep`, as a task type of django-rtq's own."""
    return chaos_sleep.func(key, ms)


@task
def chaos_api_call(key, retry_after, hold):
    """A call to an API that takes so many calls: with `retry_after`, the first run of `key` is
    answered 429 and snoozes that long (no attempt counted), holding its type if `hold`; a run
    that goes through is a recorded 10 ms run with its facts in the ledger (chaosapp/ledger.py)."""
    if retry_after and get_broker().client.incr(f"chaos:answered-429:{key}") == 1:
        raise Snooze(retry_after, hold_type=hold)
    return ledger.run(key, "chaos_api_call", 0.01, {"retry_after": retry_after, "hold": hold})


@rtq_task
def chaos_backfill(key, batch, ms):
    """Handle every order by primary key, `ms` milliseconds each, in batches of `batch` whose
    last key is saved as the checkpoint (iterate_queryset): each order handled is pushed on the
    list `<CHAOS_LEDGER>:<key>:done`, each run's start (its attempt facts and the checkpoint it
    resumes from) on `<CHAOS_LEDGER>:<key>:runs`."""
    context = current_task()
    client = get_broker().client
    ledger = f"{os.environ['CHAOS_LEDGER']}:{key}"
    facts = {
        "pid": os.getpid(),
        "retried": context.retried,
        "recovered": context.info.get("recovered", 0),
        "errors": len(context.info.get("errors", [])),
        "checkpoint": context.checkpoint,
        "at": time.time(),
    }
    client.rpush(f"{ledger}:runs", json.dumps(facts))
    for order in iterate_queryset(Order.objects.all(), batch_size=batch):
        time.sleep(ms / 1000)
        client.rpush(f"{ledger}:done", order.pk)
    return key

"""Task types the workflow tests compose."""

import time

from django_rtq import current_task, task
from django_rtq.workflows import chain

from .tasks import report


@task
def add(a, b):
    return a + b


@task
def mul(a, b):
    return a * b


@task
def total(values):
    return sum(values)


@task(queue="low")
def square_low(x):
    return x * x


@task
def split(n, size):
    """A map step: the numbers 0..n-1 in chunks of `size`."""
    return [list(range(start, min(start + size, n))) for start in range(0, n, size)]


@task(max_retries=2, retry_backoff=0)
def chunk_sum(chunk, fail_first_attempt_of=None):
    context = current_task()
    if fail_first_attempt_of is not None and chunk[0] == fail_first_attempt_of and context.retried == 0:
        raise RuntimeError("a chunk failing once")
    context.progress(len(chunk), len(chunk))
    return sum(chunk)


@task(max_retries=0)
def explode(x=None):
    raise ValueError(f"exploded on {x!r}")


@task
def mark(name, value=None):
    report(name, value)
    return value


@task
def numbers(state):
    """An iterator's function: the next 10 numbers below state["limit"]."""
    start, limit = state["next"], state["limit"]
    if start >= limit:
        return None
    stop = min(start + 10, limit)
    return {**state, "next": stop}, [mark.s(f"iterated:{state['name']}", i) for i in range(start, stop)]


@task(max_retries=2, retry_backoff=0, timeout=0.5, retention=60)
def freezes_once(chunk, frozen_chunk):
    """A chunk that hangs on its first attempt when it starts with `frozen_chunk`."""
    if chunk[0] == frozen_chunk and current_task().retried == 0:
        while True:  # stopped by the timeout
            time.sleep(0.01)
    return sum(chunk)


@task
def nests(state):
    """An iterator's function: one child, chains nested state["depth"] deep, then no more."""
    report("nests:calls", state["depth"])
    if state.get("made"):
        return None
    child = chain(add.si(1, 1))
    for _ in range(state["depth"] - 1):
        child = chain(add.si(1, 1), child)
    return {**state, "made": True}, [child]

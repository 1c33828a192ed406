"""A limited task type in a module that no worker imports at start-up (not an app's `tasks`): its
limits become known only when its first task runs (tests/test_flow_control_settings.py)."""

import json
import threading
import time

from django_rtq import task
from tests.testapp.tasks import client, report_key

_lock = threading.Lock()
_running = 0


@task(max_concurrency=1)
def one_at_a_time(name: str) -> None:
    """Record how many of its runs this process runs at once, as it starts."""
    global _running
    with _lock:
        _running += 1
        now = _running
    try:
        time.sleep(0.05)
        client().rpush(report_key(name), json.dumps({"running": now}))
    finally:
        with _lock:
            _running -= 1

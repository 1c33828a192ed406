"""Settings of the worker processes tests/chaos/test_failover.py starts.

The test suite's settings, but with django-rtq's defaults for every reliability knob (the
suite's settings shorten them) and with two Redis servers:

- the broker is at `$RTQ_CHAOS_BROKER_URL` (a Sentinel or Cluster URL whose master fails over);
- tasks report their runs to the suite's shared Redis at `$RTQ_REDIS_URL`, which stays up.

`RTQ_TEST_LEASE`, `RTQ_TEST_HEARTBEAT_INTERVAL`, `RTQ_TEST_RECOVERER_INTERVAL` and
`RTQ_TEST_RECOVERY_GRACE` set those four settings when given; otherwise django-rtq's defaults
apply. The task type `chaos.record` (below) sleeps a little, then records its run.
"""

import os

from django.apps import AppConfig

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

RECORD_TASK = "chaos.record"

RTQ = {
    "REDIS_URL": os.environ.get("RTQ_CHAOS_BROKER_URL", "redis://127.0.0.1:6379/0"),
    "KEY_PREFIX": os.environ.get("RTQ_TEST_PREFIX", "rtqtest"),
    # The ORM mirror needs migrated tables, which these processes do not have; it is not part
    # of what the failover tests look at.
    "MIRROR": False,
}
for _variable, _key in (
    ("RTQ_TEST_LEASE", "LEASE_SECONDS"),
    ("RTQ_TEST_HEARTBEAT_INTERVAL", "HEARTBEAT_INTERVAL"),
    ("RTQ_TEST_RECOVERER_INTERVAL", "RECOVERER_INTERVAL"),
    ("RTQ_TEST_RECOVERY_GRACE", "RECOVERY_GRACE"),
):
    if os.environ.get(_variable):
        RTQ[_key] = float(os.environ[_variable])


def record(name, value, seconds=0.01):
    """Work for `seconds`, then record `value` in the report list `name` on the shared Redis."""
    import time

    from tests.testapp.tasks import report

    time.sleep(seconds)
    report(name, value)
    return value


def register_record_task():
    """Register `record` as the task type `chaos.record` (in the worker and in the test)."""
    from django_rtq import task

    return task(name=RECORD_TASK)(record)


class ChaosTasks(AppConfig):
    """Registers `chaos.record` when the worker process starts."""

    name = "tests.chaos.failover_settings"
    label = "rtq_chaos_failover"

    def ready(self):
        register_record_task()


INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaos.failover_settings.ChaosTasks"]
# The suite's TASKS names a queue "low" these workers do not serve (check W001 would say so).
TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend", "QUEUES": ["default"]}}

"""Django settings of django-rtq's side of `bench/peers.py`: the peers' database, and django-rtq
on the run's private Redis, both through its own `@task` and through `django.tasks`.

The ORM mirror of finished tasks is off (no peer writes finished tasks to a database; its cost
is measured by bench/throughput.py); RETENTION is django-rtq's default, 0. The transactional
outbox is off too: nothing here enqueues on commit, and with it on every worker relays the outbox
from its table, which the bench's database lacks unless migrated (the worker then logs "cannot
relay the outbox" in every run). bench/peers/rtq_defaults_settings.py keeps both on, migrated.
"""

import os

from bench.peers.settings import DATABASES, DEFAULT_AUTO_FIELD, SECRET_KEY  # noqa: F401

DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_rtq", "bench.peers"]  # bench.peers.tasks is autodiscovered

RTQ = {
    "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "KEY_PREFIX": os.environ.get("BENCH_PREFIX", "peersbench"),
    "QUEUES": {"bench": 1},
    "DEFAULT_QUEUE": "bench",
    "MIRROR": False,
    "OUTBOX": False,
}
TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend", "QUEUES": ["bench"]}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_rtq": {"handlers": ["console"], "level": "WARNING"}},
}

"""Django settings of bench/cluster.py and its workers: django-rtq on the run's private Redis."""

import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_rtq", "bench.cluster"]  # bench.cluster.tasks is autodiscovered
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The script sets both variables; the mirror is off and nothing is retained, so that the
# figure is the queue's own cost.
RTQ = {
    "REDIS_URL": os.environ.get("BENCH_CLUSTER_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "KEY_PREFIX": os.environ.get("BENCH_CLUSTER_PREFIX", "clusterbench"),
    "QUEUES": {"bench": 1},  # the workers are given their queues with --queues
    "DEFAULT_QUEUE": "bench",
    "RETENTION": 0,
    "MIRROR": False,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_rtq": {"handlers": ["console"], "level": "WARNING"}},
}

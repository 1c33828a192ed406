"""Settings for the benchmarks: a real Redis (RTQ_REDIS_URL), SQLite, quiet logs.

`bench/throughput.py` sets RTQ_BENCH_PREFIX to a fresh key prefix for every run, and its
worker subprocess inherits it.
"""

import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_rtq", "bench"]
# A file when the ORM mirror is measured (bench/throughput.py makes one), so that the worker
# process and the benchmark share it.
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("RTQ_BENCH_DB", ":memory:")}
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

RTQ = {
    "REDIS_URL": os.environ.get("RTQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "KEY_PREFIX": os.environ.get("RTQ_BENCH_PREFIX", "rtqbench"),
    "QUEUES": {"bench": 1},
    "DEFAULT_QUEUE": "bench",
    "RETENTION": 0,
    "MIRROR": os.environ.get("RTQ_BENCH_MIRROR") == "1",
    "MIRROR_INTERVAL": float(os.environ.get("RTQ_BENCH_MIRROR_INTERVAL", "1")),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_rtq": {"handlers": ["console"], "level": "WARNING"}},
}

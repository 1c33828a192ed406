"""Django settings of bench/django_tasks_worker_cost.py's quiet variant: bench/peers/rtq_settings.py
with the `django.tasks` logger at WARNING, as docs/django.md tells a project that does not read
Django's start and end line of every task (its receivers then build no log record)."""

from bench.peers.rtq_settings import (  # noqa: F401
    DATABASES,
    DEBUG,
    DEFAULT_AUTO_FIELD,
    INSTALLED_APPS,
    RTQ,
    SECRET_KEY,
    TASKS,
    USE_TZ,
)
from bench.peers.rtq_settings import LOGGING as _LOGGING

LOGGING = {**_LOGGING, "loggers": {**_LOGGING["loggers"], "django.tasks": {"level": "WARNING"}}}

"""A project that knows Django's task API and django-rtq at its defaults: RTQ sets only where
Redis is and a key prefix. The chaos tests run it in subprocesses (tests/chaos/harness.py)."""

import os

SECRET_KEY = "chaos-project"
USE_TZ = True
INSTALLED_APPS = ["django_rtq", "chaosapp"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["CHAOS_DATABASE"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend"}}
RTQ = {"REDIS_URL": os.environ["CHAOS_REDIS_URL"], "KEY_PREFIX": os.environ["CHAOS_KEY_PREFIX"]}

"""South's settings: its own secret key and app, django-rtq at its defaults (its default key
prefix too) on the Redis it shares with the other project (CHAOS_REDIS_URL)."""

import os

SECRET_KEY = "south-project"
USE_TZ = True
INSTALLED_APPS = ["django_rtq", "southapp"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["CHAOS_DATABASE"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend"}}
RTQ = {"REDIS_URL": os.environ["CHAOS_REDIS_URL"]}

"""A plain Django project that knows only `django.tasks` and the TASKS setting (and that
django-rtq is installed). Its tests run it in subprocesses: see tests/test_plain_project.py."""

import os

SECRET_KEY = "plain-project"
USE_TZ = True
INSTALLED_APPS = ["django_rtq", "shop"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["PLAIN_DATABASE"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend"}}

"""A project that knows Django's task API and django-rtq at its defaults: RTQ sets only where
Redis is and a key prefix. The chaos tests run it in subprocesses (tests/chaos/harness.py).

Its database is a SQLite file (CHAOS_DATABASE), or the PostgreSQL database CHAOS_PG_NAME if
that is set. CHAOS_TASKS_OUTBOX=1 turns on the tasks backend's transactional outbox.
CHAOS_RELEASE names the release of `deployapp` on the process's path, if any."""

import os

SECRET_KEY = "chaos-project"
USE_TZ = True
INSTALLED_APPS = ["django_rtq", "chaosapp"]
if os.environ.get("CHAOS_RELEASE"):  # a process of a release of deployapp (releases/<release>/)
    INSTALLED_APPS.append("deployapp")
if os.environ.get("CHAOS_PG_NAME"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["CHAOS_PG_NAME"],
            "HOST": os.environ.get("RTQ_TEST_PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("RTQ_TEST_PGPORT", "5432"),
            "USER": os.environ.get("RTQ_TEST_PGUSER", "postgres"),
        }
    }
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["CHAOS_DATABASE"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "chaossite.urls"
ALLOWED_HOSTS = ["testserver"]  # django.test.Client's host
MIDDLEWARE = ["django.middleware.security.SecurityMiddleware", "django.middleware.common.CommonMiddleware"]
TASKS = {"default": {"BACKEND": "django_rtq.backends.RTQBackend"}}
if os.environ.get("CHAOS_TASKS_OUTBOX") == "1":
    TASKS["default"]["OPTIONS"] = {"OUTBOX": True}
RTQ = {"REDIS_URL": os.environ["CHAOS_REDIS_URL"], "KEY_PREFIX": os.environ["CHAOS_KEY_PREFIX"]}

"""Settings for the test suite: a real Redis (RTQ_REDIS_URL), SQLite, short intervals."""

import json
import os
import tempfile

# A worker process of "another project" gets a key of its own (tests/test_projects_sharing_redis.py).
SECRET_KEY = os.environ.get("RTQ_TEST_SECRET_KEY", "tests-only")
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_rtq",
    "tests.testapp",
]
# The admin (django-rtq's live views are in it): tests/test_admin*.py.
ROOT_URLCONF = "tests.urls"
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
# A file, not :memory:, so that worker threads share the test database and really close
# their connections (Django keeps in-memory SQLite connections open).
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(tempfile.gettempdir(), "rtq-tests.sqlite3"),
        "TEST": {"NAME": os.path.join(tempfile.gettempdir(), f"rtq-tests-{os.getpid()}.sqlite3")},
    }
}
if os.environ.get("RTQ_TEST_DATABASE") == "postgresql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("RTQ_TEST_PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("RTQ_TEST_PGPORT", "5432"),
            "USER": os.environ.get("RTQ_TEST_PGUSER", "postgres"),
            "NAME": "rtq",
            "TEST": {"NAME": f"rtq_test_{os.getpid()}"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

RTQ = {
    "REDIS_URL": os.environ.get("RTQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "KEY_PREFIX": os.environ.get("RTQ_TEST_PREFIX", "rtqtest"),
    "QUEUES": {"default": 1, "low": 1},  # "low": for a queue in TASKS (the W001 check)
    "RETRY_BACKOFF": 0,
    "LEASE_SECONDS": float(os.environ.get("RTQ_TEST_LEASE", "30")),
    "RECOVERY_GRACE": 0,
    "RECOVERER_INTERVAL": float(os.environ.get("RTQ_TEST_RECOVERER_INTERVAL", "0.2")),
    "HEARTBEAT_INTERVAL": float(os.environ.get("RTQ_TEST_HEARTBEAT_INTERVAL", "0.2")),
    "FORWARDER_INTERVAL": 0.1,
    "JANITOR_INTERVAL": 0.2,
    "SYNCER_INTERVAL": 0.1,
    "HEALTHCHECK_INTERVAL": 0.5,
    "SHUTDOWN_TIMEOUT": 5,
    "IDLE_WAIT": 0.5,
    "MIRROR": False,  # tests of the mirror turn it on
    "MIRROR_INTERVAL": 0.1,
    # flow control: a worker process's queue limits, as JSON (tests/test_flow_control_workers.py)
    "QUEUE_LIMITS": json.loads(os.environ.get("RTQ_TEST_QUEUE_LIMITS", "{}")),
    # a worker process on an evicting Redis (tests/test_redis_configuration_guard.py)
    "ALLOW_EVICTING_REDIS": os.environ.get("RTQ_TEST_ALLOW_EVICTING_REDIS") == "1",
}

TASKS = {
    "default": {"BACKEND": "django_rtq.backends.RTQBackend", "QUEUES": ["default", "low"]},
}

# The test app's `record_high` goes to "high", served by workers that tests start for it.
SILENCED_SYSTEM_CHECKS = ["django_rtq.W004"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_rtq": {
            "handlers": ["console"],
            "level": os.environ.get("RTQ_TEST_LOGLEVEL", "WARNING"),
        }
    },
}

"""Django settings of the peers' worker processes: only a database, for the ORM handler.

PostgreSQL on 127.0.0.1:5432, user postgres, database `test` (trust auth); BENCH_PG_DB names
another. Connections are kept open (CONN_MAX_AGE None) so that every system's threads reuse
theirs: Celery's Django fixup and django-rtq's worker close only obsolete connections.
"""

import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS: list[str] = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_PG_DB", "test"),
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "CONN_MAX_AGE": None,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

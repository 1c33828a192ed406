"""Django settings of bench/peers.py's "rtq-django-defaults": django.tasks at django-rtq's defaults.

The same as bench/peers/rtq_settings.py but for MIRROR and OUTBOX, which are left out, so on as
a project gets them: every finished task is written to PostgreSQL, and every worker relays the
outbox. Issue 29 states its bar at the defaults as well as with the mirror off. bench/peers.py
migrates the database (`test`) before this system's first use, and deletes the mirror's rows
before each measurement: with RETENTION 0 they are kept for MIRROR_MAX_AGE (30 days).
"""

from bench.peers import rtq_settings
from bench.peers.rtq_settings import (  # noqa: F401
    DATABASES,
    DEBUG,
    DEFAULT_AUTO_FIELD,
    INSTALLED_APPS,
    LOGGING,
    SECRET_KEY,
    TASKS,
    USE_TZ,
)

RTQ = {key: value for key, value in rtq_settings.RTQ.items() if key not in ("MIRROR", "OUTBOX")}

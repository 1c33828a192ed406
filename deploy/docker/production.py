"""Production settings of the test project in the Docker image (deploy/docker/Dockerfile):
its settings, with the secrets and hosts from the environment that compose.yaml sets."""

import os

from .settings import *  # noqa: F403
from .settings import BASE_DIR

SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
DEBUG = False
ALLOWED_HOSTS = [host for host in os.environ.get("DJANGO_ALLOWED_HOSTS", "").split(",") if host]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("POSTGRES_HOST", "db"),
        "PORT": os.environ.get("POSTGRES_PORT", "5432"),
        "NAME": os.environ.get("POSTGRES_DB", "mysite"),
        "USER": os.environ.get("POSTGRES_USER", "mysite"),
        "PASSWORD": os.environ.get("POSTGRES_PASSWORD", ""),
        # Each web and worker thread holds a connection of its own (docs/deploying.md, "Sizing").
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }
}

RTQ = {
    "REDIS_URL": os.environ.get("RTQ_REDIS_URL", "redis://redis:6379/0"),
    "KEY_PREFIX": os.environ.get("RTQ_KEY_PREFIX", "mysite"),
    "QUEUES": {"critical": 6, "default": 3, "low": 1},
}

STATIC_ROOT = BASE_DIR / "staticfiles"

# Behind a proxy that ends TLS and sets X-Forwarded-Proto.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = os.environ.get("DJANGO_SSL_REDIRECT", "1") == "1"
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "3600"))
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# HSTS for subdomains and the browsers' preload list bind every subdomain to HTTPS for good:
# decide them for your domain, then remove these from the silenced checks.
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021"]

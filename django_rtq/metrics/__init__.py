"""Prometheus metrics of the queues and workers: mount `django_rtq.metrics.urls` (the `metrics` extra)."""

from ..extras import require_extra

require_extra("metrics", "django_rtq.metrics (the Prometheus endpoint)")

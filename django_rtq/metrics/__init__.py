"""Prometheus metrics of the queues and workers: mount `django_rtq.metrics.urls` (needs prometheus-client)."""

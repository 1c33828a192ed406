"""The task modules, settings and driver of `bench/peers.py` (django-rtq beside huey, Dramatiq,
Celery and RQ): each module here is imported inside one system's own virtualenv."""

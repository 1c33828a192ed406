"""bench.peers.rtq_quiet_settings (the `django.tasks` logger at WARNING), with a worker that stamps
its latency tasks' parts (bench/latency_parts.py's `rtq-django-quiet`)."""

from bench.peers import parts
from bench.peers.rtq_quiet_settings import *  # noqa: F403

parts.install_worker("pubsub")

"""bench.peers.rtq_settings, with a worker that stamps its latency tasks' parts (bench/latency_parts.py)."""

from bench.peers import parts
from bench.peers.rtq_settings import *  # noqa: F403

parts.install_worker("pubsub")

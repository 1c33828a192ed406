"""huey's app (bench.peers.huey_tasks), with a consumer that stamps its latency tasks' parts
(bench/latency_parts.py). Consumer: `huey_consumer bench.peers.parts_huey.huey -k thread`."""

from bench.peers import parts

parts.install_worker("brpop")

from bench.peers.huey_tasks import huey  # noqa: E402, F401

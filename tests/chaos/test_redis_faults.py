"""Redis restarted, and unreachable for a minute, under working workers: nothing lost, no false failures."""

from __future__ import annotations

import time

import pytest

from tests.support.proxy import TCPProxy

pytestmark = pytest.mark.chaos

#: How long Redis is unreachable to the workers in the outage scenario.
OUTAGE_SECONDS = 60.0


@pytest.mark.timeout(300)
def test_redis_restarted_mid_run(redis_servers, chaos_project):
    """Two workers on 1,000 tasks of 20 ms, with a client enqueueing 600 more at 100 a second;
    a third of the way through Redis (append-only, fsync always) is SIGKILLed and restarted."""
    server = redis_servers("--appendonly", "yes", "--appendfsync", "always")
    chaos = chaos_project(server.url)
    chaos.enqueue([(f"a{i}", 20) for i in range(1000)], name="bulk")
    chaos.wait_clients(timeout=60)
    chaos.enqueue([(f"s{i}", 20) for i in range(600)], interval=0.01, name="stream")
    for slot in range(2):
        chaos.start_worker(name=f"r{slot}")
    chaos.wait_ended(350)

    killed = time.time()
    server.restart(down_seconds=1.0)
    restarted = time.time()

    drained_at = chaos.wait_drained(90)
    running = chaos.running_at(killed)
    chaos.verify(
        "redis-restart",
        f"restarts=1 runs_at_restart={running}",
        last_fault=restarted,
        drained_at=drained_at,
        check_results=True,
    )


@pytest.fixture
def tcp_proxy():
    """A TCPProxy to a port (tests/support/proxy.py), taken down at teardown: `tcp_proxy(port)`."""
    proxies = []

    def start(port: int) -> TCPProxy:
        proxy = TCPProxy("127.0.0.1", port).up()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.down()


@pytest.mark.timeout(400)
def test_redis_unreachable_for_a_minute(redis_servers, chaos_project, tcp_proxy):
    """Two workers reach Redis through a proxy, on 400 tasks of 500 ms; the proxy is cut for
    60 s while a client (on Redis directly) enqueues 100 more, then it is up again: the workers
    resume by themselves, and every task succeeded as far as Django's task API can tell."""
    server = redis_servers()
    proxy = tcp_proxy(server.port)
    chaos = chaos_project(server.url, worker_url=f"redis://127.0.0.1:{proxy.port}/0")
    chaos.enqueue([(f"a{i}", 500) for i in range(400)], name="before")
    chaos.wait_clients(timeout=60)
    for slot in range(2):
        chaos.start_worker(name=f"o{slot}")
    chaos.wait_ended(60)

    cut = time.time()
    proxy.down()
    chaos.enqueue([(f"b{i}", 500) for i in range(100)], interval=0.2, name="during")
    time.sleep(OUTAGE_SECONDS)  # the fault itself: Redis unreachable to the workers
    proxy.up()
    back = time.time()

    drained_at = chaos.wait_drained(120)
    chaos.verify(
        "redis-outage-60s",
        f"outages=1 runs_at_cut={chaos.running_at(cut)}",
        last_fault=back,
        drained_at=drained_at,
        check_results=True,
    )

"""The script lane (django_rtq/broker/lane.py): each thread's own connection for script calls,
against real Redis servers, with real faults: a restart, a killed connection, a timeout."""

from __future__ import annotations

import gc
import multiprocessing
import threading

import fakeredis
import pytest
import redis
from redis.backoff import ConstantBackoff, NoBackoff
from redis.retry import Retry

from django_rtq.broker import Broker
from django_rtq.broker.lane import ScriptLane, lane_pool
from django_rtq.exceptions import BrokerUnavailable
from tests.support.factories import EMAILS, message
from tests.support.polling import wait_for
from tests.support.reading import state_of
from tests.support.servers import RedisProcess


class CountingBackoff(ConstantBackoff):
    """No wait between retries; counts them in `retries`, shared by its copies (redis-py gives
    each connection a copy of the client's Retry)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.retries: list[int] = []

    def compute(self, failures: int) -> float:
        self.retries.append(failures)
        return 0

    def __deepcopy__(self, memo: dict) -> CountingBackoff:
        return self


@pytest.fixture
def server():
    process = RedisProcess().start()
    yield process
    process.stop()


def client_of(server: RedisProcess, **options) -> redis.Redis:
    return redis.Redis(port=server.port, decode_responses=True, **options)


def in_thread(call):
    """Run `call` in a new thread that then ends; return its result."""
    results = []
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    thread.join()
    return results[0]


def test_a_thread_sends_its_calls_on_one_connection_of_its_own(server):
    lane = ScriptLane(client_of(server))

    first, second = lane.execute("CLIENT", "ID"), lane.execute("CLIENT", "ID")
    other = in_thread(lambda: lane.execute("CLIENT", "ID"))

    assert first == second
    assert other != first


def test_the_connection_goes_back_to_the_pool_when_its_thread_ends(server):
    client = client_of(server)
    lane = ScriptLane(client)

    held = in_thread(lambda: lane.execute("CLIENT", "ID"))
    gc.collect()

    assert client.client_id() == held  # the pool hands out the connection given back last


def test_a_restart_while_the_thread_was_away_is_ridden_out(tmp_path):
    server = RedisProcess(directory=str(tmp_path)).start()
    try:
        # no retries: the call after the restart must find the dead connection before it sends
        lane = ScriptLane(client_of(server, retry=Retry(NoBackoff(), 0)))
        lane.execute("SET", "before", "1")
        server.kill()
        server.start()

        assert lane.execute("SET", "after", "1") is True
    finally:
        server.kill()


def test_a_call_while_redis_is_away_fails_as_the_clients_own_command_would(server):
    lane_backoff, client_backoff = CountingBackoff(), CountingBackoff()
    lane = ScriptLane(client_of(server, retry=Retry(lane_backoff, 3)))
    client = client_of(server, retry=Retry(client_backoff, 3))
    lane.execute("PING")
    client.ping()
    server.kill()

    for _ in range(2):  # on the connection Redis closed, then on none
        with pytest.raises(redis.ConnectionError):
            lane.execute("PING")
        with pytest.raises(redis.ConnectionError):
            client.execute_command("PING")
    assert lane_backoff.retries == client_backoff.retries


def blocked_clients(server: RedisProcess) -> list[dict]:
    return [c for c in client_of(server).client_list() if c["cmd"] == "blpop"]


def test_a_command_cut_short_is_retried_by_the_clients_retry(server):
    backoff = CountingBackoff()
    lane = ScriptLane(client_of(server, retry=Retry(backoff, 3)))
    results = []
    waiting = threading.Thread(target=lambda: results.append(lane.execute("BLPOP", "cut", 10)))
    waiting.start()
    first = wait_for(lambda: blocked_clients(server))[0]
    client_of(server).client_kill_filter(_id=first["id"])
    wait_for(lambda: [c for c in blocked_clients(server) if c["id"] != first["id"]])
    client_of(server).rpush("cut", "late")
    waiting.join(10)

    assert results == [("cut", "late")]  # redis-py's reply for BLPOP
    assert backoff.retries == [1]


def test_a_killed_connection_is_replaced(server):
    client = client_of(server, retry=Retry(NoBackoff(), 0))
    lane = ScriptLane(client)
    held = lane.execute("CLIENT", "ID")

    client_of(server).client_kill_filter(_id=held)

    assert lane.execute("CLIENT", "ID") != held


def test_an_error_reply_leaves_the_connection_in_use(server):
    lane = ScriptLane(client_of(server))
    held = lane.execute("CLIENT", "ID")

    with pytest.raises(redis.exceptions.NoScriptError):
        lane.execute("EVALSHA", "0" * 40, 0)

    assert lane.execute("CLIENT", "ID") == held


def test_a_reply_cut_short_is_never_read_as_the_next_one(server):
    """A timeout leaves the slow command's reply on its way: the next call must not take it."""
    lane = ScriptLane(client_of(server, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)))

    with pytest.raises(redis.TimeoutError):
        lane.execute("BLPOP", "slow", 5)
    client_of(server).rpush("slow", "late reply")  # what the cut BLPOP would answer

    assert lane.execute("ECHO", "fresh") == "fresh"


def test_the_lane_holds_at_most_half_of_the_pool(server):
    """Threads past half of max_connections send their calls the ordinary way, so the client's
    own commands still find a connection while every thread holds its own."""
    client = client_of(server, max_connections=4)
    lane = ScriptLane(client)
    called, release = threading.Barrier(5), threading.Event()

    def worker():
        lane.execute("PING")
        called.wait()
        release.wait()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    called.wait()
    try:
        assert client.ping() is True
        assert client.ping() is True  # two connections left: the lane holds two
    finally:
        release.set()
        for thread in threads:
            thread.join()


def _child_client_id(lane: ScriptLane, results: multiprocessing.Queue) -> None:
    results.put(lane.execute("CLIENT", "ID"))


def test_a_forked_child_takes_its_own_connection(server):
    lane = ScriptLane(client_of(server))
    parent = lane.execute("CLIENT", "ID")
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_child_client_id, args=(lane, results))
    child.start()
    child.join(10)

    assert results.get(timeout=5) != parent
    assert lane.execute("CLIENT", "ID") == parent


def test_it_packs_a_call_as_redis_py_does(server):
    client = client_of(server)
    lane = ScriptLane(client)
    script, args = "return {ARGV[1], ARGV[2], ARGV[3], ARGV[4]}", (1.5, "é", 10**20, b"x")

    assert lane.execute("EVAL", script, 0, *args) == client.eval(script, 0, *args)
    with pytest.raises(redis.DataError):
        lane.execute("ECHO", True)


@pytest.mark.parametrize(
    "make",
    [
        lambda port: redis.Redis(connection_pool=redis.BlockingConnectionPool(port=port)),
        lambda port: redis.Redis(port=port, single_connection_client=True),
        lambda port: fakeredis.FakeRedis(),
    ],
    ids=["blocking pool", "single connection", "fakeredis"],
)
def test_other_clients_keep_their_own_path(server, make):
    client = make(server.port)

    assert lane_pool(client) is None
    assert ScriptLane(client).execute("ECHO", "x") in ("x", b"x")


def test_the_broker_enqueues_through_the_lane_and_through_a_restart(tmp_path, prefix):
    server = RedisProcess("--appendonly", "yes", "--appendfsync", "always", directory=str(tmp_path)).start()
    try:
        broker = Broker(client_of(server), prefix=prefix)
        assert broker.lane.pool is not None
        before = message(EMAILS)
        broker.enqueue([before])
        server.kill()
        with pytest.raises(BrokerUnavailable):
            broker.enqueue([message(EMAILS)])
        server.start()
        after = message(EMAILS)
        broker.enqueue([after])

        assert [state_of(broker, EMAILS, task.id) for task in (before, after)] == ["pending", "pending"]
    finally:
        server.kill()

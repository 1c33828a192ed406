"""Redis's own configuration, on real servers: an evicting Redis is an error of `check --deploy`
and a worker refuses to start on it (unless the project accepts it); a Redis without
persistence is a warning; where CONFIG is renamed (a managed Redis) INFO is read instead, and
a Cluster is checked master by master. A Redis restarted without its data is told by the
worker as such, naming the leases it lost, not as results that "came late"."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from django.core.checks import run_checks

from django_rtq.broker import TaskState
from django_rtq.broker.redis_config import TOO_OLD, ServerConfig, findings, read_configs
from django_rtq.checks import REDIS_TAG
from django_rtq.connection import get_broker, reset_broker
from django_rtq.exceptions import BrokerUnavailable
from django_rtq.worker.outcome import tell_left_out
from django_rtq.worker.redis_watch import RedisWatch
from tests.support.factories import EMAILS, OTHER_WORKER, WORKER, claim_ids, done, make_tasks
from tests.support.polling import wait_for
from tests.support.processes import OutputLines
from tests.support.servers import RedisProcess, SentinelProcess, cleanup_dir
from tests.testapp import tasks
from tests.testapp.tasks import report_key

#: The checks of Redis's configuration.
CONFIG_CHECKS = ("django_rtq.E006", "django_rtq.W010", "django_rtq.W011", "django_rtq.E007")


def config_messages() -> list:
    messages = run_checks(tags=[REDIS_TAG], include_deployment_checks=True)
    return [message for message in messages if message.id in CONFIG_CHECKS]


@pytest.fixture
def own_redis(settings, prefix) -> Iterator[Callable[..., RedisProcess]]:
    """Start a redis-server with the given options and make it the process's Redis."""
    servers: list[RedisProcess] = []

    def start(*options: str) -> RedisProcess:
        server = RedisProcess(*options).start()
        servers.append(server)
        settings.RTQ = {**settings.RTQ, "REDIS_URL": server.url}
        reset_broker()
        return server

    yield start
    reset_broker()
    for server in servers:
        server.stop()
        cleanup_dir(server.dir)


def test_an_evicting_redis_is_an_error_of_check_deploy(own_redis):
    server = own_redis("--maxmemory-policy", "allkeys-lru", "--appendonly", "yes")
    (error,) = config_messages()
    assert error.id == "django_rtq.E006" and error.is_serious()
    assert f"127.0.0.1:{server.port}" in error.msg and "allkeys-lru" in error.msg
    assert "lost" in error.msg and "ALLOW_EVICTING_REDIS" in error.hint


def test_the_error_goes_when_the_project_accepts_eviction(own_redis, settings):
    own_redis("--maxmemory-policy", "volatile-lru", "--appendonly", "yes")
    assert [message.id for message in config_messages()] == ["django_rtq.E006"]
    settings.RTQ = {**settings.RTQ, "ALLOW_EVICTING_REDIS": True}
    assert config_messages() == []


def test_only_eviction_and_the_lack_of_persistence_are_told(own_redis):
    told = {}
    for options in (
        ("--maxmemory-policy", "noeviction", "--appendonly", "yes"),
        ("--save", "900 1"),  # RDB save points are persistence too
        ("--maxmemory-policy", "allkeys-lru", "--save", "900 1"),
        ("--appendonly", "no"),
    ):
        own_redis(*options)
        told[options] = [message.id for message in config_messages()]
    assert list(told.values()) == [[], [], ["django_rtq.E006"], ["django_rtq.W010"]]


def test_the_server_s_version_is_read_and_one_older_than_redis_7_is_an_error(own_redis):
    server = own_redis("--appendonly", "yes")
    (config,) = read_configs(get_broker().client)
    assert config.version == redis.Redis.from_url(server.url).info("server")["redis_version"]
    assert findings([config]) == []  # this machine's server is 7.0 or newer
    # No Redis 6 can be started here (Debian and PyPI carry 7.0+), so the rule is shown on what
    # such a server would report; the worker refuses to start on it as on an evicting one.
    old = ServerConfig(node="10.0.0.5:6379", eviction_policy="noeviction", aof=True, version="6.2.14")
    (finding,) = findings([old], eviction_allowed=True)
    assert finding.kind == TOO_OLD and finding.is_error
    assert "6.2.14" in finding.message and "7.0 or newer" in finding.message
    assert findings([ServerConfig(node="n", eviction_policy="noeviction", aof=True, version="7.0.0")]) == []


def test_a_redis_without_persistence_is_a_warning_naming_what_a_restart_loses(own_redis):
    server = own_redis()  # --save "" --appendonly no
    (warning,) = config_messages()
    assert warning.id == "django_rtq.W010" and not warning.is_serious()
    assert f"127.0.0.1:{server.port}" in warning.msg
    assert "restart loses every task" in warning.msg and "scheduled" in warning.msg


def test_with_config_renamed_info_tells_the_policy(own_redis):
    own_redis("--rename-command", "CONFIG", "", "--maxmemory-policy", "allkeys-random", "--appendonly", "yes")
    (error,) = config_messages()
    assert error.id == "django_rtq.E006" and "allkeys-random" in error.msg


def test_with_config_renamed_what_info_cannot_tell_is_said_once(own_redis):
    own_redis("--rename-command", "CONFIG", "")  # AOF off; INFO does not show RDB save points
    (warning,) = config_messages()
    assert warning.id == "django_rtq.W011"
    assert "keeps its data over a restart" in warning.msg and "CONFIG GET is refused" in warning.msg
    assert "evicts" not in warning.msg  # INFO told the policy: noeviction


def test_each_master_of_a_cluster_is_checked(settings, redis_cluster):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}"}
    reset_broker()
    warnings = config_messages()
    assert {message.id for message in warnings} == {"django_rtq.W010"}  # the test cluster's nodes
    named = sorted(port for port in redis_cluster.ports for m in warnings if f":{port} " in m.msg)
    assert named == sorted(redis_cluster.ports)


def test_sentinel_s_master_is_checked(own_redis, settings):
    master = own_redis("--maxmemory-policy", "allkeys-lfu")
    sentinel = SentinelProcess(master.port, "mymaster").start()
    try:
        settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster"}
        reset_broker()
        told = {message.id: message.msg for message in config_messages()}
        assert sorted(told) == ["django_rtq.E006", "django_rtq.W010"]
        assert "the master of Sentinel service 'mymaster'" in told["django_rtq.E006"]
        assert "allkeys-lfu" in told["django_rtq.E006"]
    finally:
        reset_broker()
        sentinel.stop()
        cleanup_dir(sentinel.dir)


def test_a_worker_refuses_to_start_on_an_evicting_redis_unless_the_project_accepts_it(
    own_redis, start_worker, prefix
):
    server = own_redis("--maxmemory-policy", "allkeys-lru", "--appendonly", "yes")
    refused = start_worker(RTQ_REDIS_URL=server.url)
    output, _ = refused.communicate(timeout=60)
    assert refused.returncode != 0
    assert "does not start" in output and "allkeys-lru" in output and "ALLOW_EVICTING_REDIS" in output

    accepted = start_worker(RTQ_REDIS_URL=server.url, RTQ_TEST_ALLOW_EVICTING_REDIS="1")
    client = redis.Redis(port=server.port, decode_responses=True)
    wait_for(lambda: client.zcard(f"{prefix}:workers"), timeout=30, message="the worker to register")
    assert accepted.poll() is None
    client.close()


def test_a_worker_tells_of_a_redis_restarted_without_its_data(own_redis, start_worker, prefix):
    server = own_redis()  # no persistence
    process = start_worker("--concurrency", "2", RTQ_REDIS_URL=server.url)
    output = OutputLines(process)
    client = redis.Redis(port=server.port, decode_responses=True)
    wait_for(lambda: client.exists(f"{prefix}:server-marker"), timeout=30, message="the watch's first look")
    running = tasks.sleep_in_c.enqueue("lost", 8.0)  # its handler sleeps 8 s, then returns
    scheduled = tasks.record.using(delay=600).enqueue("later")
    wait_for(lambda: client.lrange(report_key("lost:started"), 0, -1), timeout=30, message="the task to run")
    assert client.hget(f"{prefix}:{{default}}:state", scheduled.id) == "scheduled"
    assert output.having(f"Redis at 127.0.0.1:{server.port} keeps nothing over a restart")  # warned

    server.kill()
    restarted = RedisProcess(port=server.port, directory=server.dir).start()
    try:
        told_of = f"Redis at 127.0.0.1:{server.port} restarted without its data"
        (told,) = wait_for(lambda: output.having(told_of), timeout=30, message="the restart told")
        assert "scheduled" in told and "1 lease(s) held by this worker were lost" in told
        assert running.id in told
        assert client.hget(f"{prefix}:{{default}}:state", scheduled.id) is None  # the fault landed
        wait_for(lambda: client.lrange(report_key("lost"), 0, -1), timeout=30, message="the handler's end")
        (left_out,) = wait_for(
            lambda: output.having("no longer exists"), timeout=30, message="its result left out"
        )
        assert running.id in left_out
        assert output.having("came late") == []
        assert len(output.having(told_of)) == 1
    finally:
        client.close()
        process.kill()
        restarted.stop()


def test_the_watch_tells_a_restart_that_lost_the_data_as_an_error_once(own_redis, caplog):
    server = own_redis()
    watch = RedisWatch(broker=get_broker(), held=lambda: {"default": ["t1", "t2"]})
    watch.look()
    watch.look()  # the same run: nothing to tell
    assert [r for r in caplog.records if "restarted" in r.getMessage()] == []
    server.kill()
    restarted = RedisProcess(port=server.port, directory=server.dir).start()
    try:
        wait_for(lambda: _looked(watch), timeout=10, ignoring=(BrokerUnavailable,), message="a look")
        watch.look()
        (record,) = [r for r in caplog.records if "restarted without its data" in r.getMessage()]
        assert record.levelname == "ERROR"
        assert "2 lease(s) held by this worker were lost: t1 (default), t2 (default)" in record.getMessage()
    finally:
        restarted.stop()


def test_a_restart_that_kept_the_data_is_not_a_loss(own_redis, caplog):
    server = own_redis("--appendonly", "yes", "--appendfsync", "always")
    watch = RedisWatch(broker=get_broker(), held=dict)
    watch.look()
    server.stop()  # SIGTERM: the server saves and leaves
    restarted = RedisProcess("--appendonly", "yes", port=server.port, directory=server.dir).start()
    try:
        wait_for(lambda: _looked(watch), timeout=10, ignoring=(BrokerUnavailable,), message="a look")
        assert [r for r in caplog.records if "without its data" in r.getMessage()] == []
        (record,) = [r for r in caplog.records if "and kept its data" in r.getMessage()]
        assert record.levelname == "WARNING"
    finally:
        restarted.stop()


def _looked(watch: RedisWatch) -> bool:
    watch.look()
    return True


def test_on_a_cluster_each_master_holds_a_marker_of_its_own(settings, prefix, redis_cluster):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}"}
    reset_broker()
    watch = RedisWatch(broker=get_broker(), held=dict)
    watch.look()
    for port in redis_cluster.ports:
        node = redis_cluster.node_client(port)
        run_id = node.info("server")["run_id"]
        markers = [key for key in node.scan_iter(f"{prefix}:server-marker*") if node.get(key) == run_id]
        assert len(markers) == 1, port
        node.delete(*markers)
        node.close()
    reset_broker()


def test_results_left_out_are_told_late_or_of_a_task_that_no_longer_exists(broker, caplog):
    late, settled, gone = make_tasks(broker, TaskState.ACTIVE, EMAILS, count=3)  # run 1 each, by WORKER
    broker.requeue(EMAILS, [late], worker_id=WORKER)
    assert claim_ids(broker, EMAILS, worker=OTHER_WORKER) == [late]  # run 2
    broker.client.hdel(broker.queue(EMAILS).runs, gone)  # as after a restart that lost it
    # kept for a while when settled: a task deleted at once leaves only the count of the gone certain
    completions = [done(task_id, retention=60) for task_id in (late, settled, gone)]

    count = broker.complete(EMAILS, completions, worker_id=WORKER)
    tell_left_out(broker, EMAILS, {c.id: c.run for c in completions}, settled=count, what="result")

    messages = [record.getMessage() for record in caplog.records]
    assert count == 1
    assert [m for m in messages if "came late" in m] == [
        f"1 result(s) in queue {EMAILS!r} came late and were left out (a newer run of the task had "
        f"started): {late}"
    ]
    (told_gone,) = [m for m in messages if "no longer exists" in m]
    assert told_gone.startswith(f"1 result(s) in queue {EMAILS!r} were left out") and gone in told_gone
    assert late not in told_gone and settled not in told_gone

"""Drain rate of django-rtq on a 3-master Redis Cluster on loopback, beside one node's. A script, not a test.

Run from the repository root:

    .venv-test/django5/bin/python bench/cluster.py [--tasks 30000] [--concurrency 10] [--repeat 1]
        [--skip-shared] [--skip-standalone]

It starts its own Redis Cluster of three masters (no replicas, no persistence) on free loopback
ports, the way the test suite does (tests/support/cluster.py), picks three queues whose hash tags fall
on the three masters, and drains empty tasks with real worker processes (`python -m django
rtq_worker --queues ... --concurrency N`, settings bench.cluster.settings: the ORM mirror off,
nothing retained). It measures:

1. one node: one queue, one worker process;
2. three queues on the three masters, three worker processes, each on its own queue, all at
   once: the total rate and each worker's;
3. three worker processes, each serving all three queues (unless --skip-shared);
4. for what cluster mode itself costs, one queue and one worker on a standalone redis-server of
   the same binary (unless --skip-standalone).

Each drain pauses its queues, enqueues `--tasks` tasks a queue with one `enqueue_many` call,
starts the workers, waits for them to register, and resumes the queues. Its rate is all its
tasks over the time from the first task's start to the last task's end, as the task bodies
report them (each worker process counts in memory and reports every 10 ms:
bench/cluster/tasks.py); a worker's rate is its tasks over its own first start to last end.
A drain's CPU figure is the CPU time its workers and redis-servers used from the resume until
the driver saw the last report, over that wall time: on a 2-core machine it cannot pass 2; "the
rest of the machine" is what every other process (this script's polling included) used
meanwhile, so a drain another engineer's run shared the cores with shows.
`--repeat N` runs the measures N times in turn and prints the medians. Servers and workers are
stopped and the servers' directories deleted at the end, on Ctrl-C, SIGTERM or an error too.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SETTINGS = "bench.cluster.settings"
WORKER_START_TIMEOUT = 30.0
WORKER_STOP_TIMEOUT = 20.0
DRAIN_TIMEOUT = 300.0
#: Seconds between two looks at the done counters while the workers drain.
POLL_INTERVAL = 0.01
#: Queue names tried, in order, until each master holds one.
QUEUE_CANDIDATES = 100
PR_SET_PDEATHSIG = 1

ONE_NODE = "one node"
THREE = "three queues, three workers"
SHARED = "three workers, all three queues"
STANDALONE = "standalone redis-server"
LABELS = {
    ONE_NODE: "one node: 1 queue, 1 worker",
    THREE: "cluster: 3 queues on 3 masters, 3 workers (one queue each)",
    SHARED: "cluster: 3 queues on 3 masters, 3 workers (each on all 3 queues)",
    STANDALONE: "standalone redis-server: 1 queue, 1 worker",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=30000, help="empty tasks enqueued per queue")
    parser.add_argument("--concurrency", type=int, default=10, help="threads of each worker process")
    parser.add_argument("--repeat", type=int, default=1, help="run the measures this many times")
    parser.add_argument("--skip-shared", action="store_true", help="leave out measure 3")
    parser.add_argument("--skip-standalone", action="store_true", help="leave out measure 4")
    return parser.parse_args()


def use_repo_root() -> None:
    # `python bench/cluster.py` puts bench/ first on sys.path; the repo root is what we need.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != here]
    sys.path.insert(0, str(REPO_ROOT))


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that the cleanup in `finally` runs."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def die_with_parent() -> None:
    """Have the kernel send a worker SIGTERM if this script dies before stopping it (Linux)."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# The servers


@dataclass
class Servers:
    """The run's redis-server processes: the cluster's masters, and a standalone one."""

    nodes: list[Any]
    standalone: Any | None

    @property
    def cluster_url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def stop(self) -> None:
        from tests.support.servers import cleanup_dir

        for server in [*self.nodes, self.standalone]:
            if server is not None:
                server.stop()
                cleanup_dir(server.dir)


def start_servers(servers: Servers, *, standalone: bool) -> None:
    """Start the three masters and make them a cluster (and the standalone server if asked)."""
    from tests import cluster as test_cluster
    from tests.support.servers import RedisProcess

    for _ in range(test_cluster.NODES):
        servers.nodes.append(test_cluster.cluster_node())
        servers.nodes[-1].start()
    ports = [node.port for node in servers.nodes]
    cli = test_cluster.cli_binary()
    if cli:
        test_cluster.create_with_cli(cli, ports)
    else:
        test_cluster.create_with_commands(ports)
    test_cluster.wait_until_ready(ports)
    if standalone:
        servers.standalone = RedisProcess()
        servers.standalone.start()


def pick_queues(cluster_url: str) -> dict[str, int]:
    """Return {queue: port of its master}: the first names whose hash tags land on each master."""
    from django_rtq.redis_url import connect, parse_url

    client = connect(parse_url(cluster_url))
    try:
        masters = {node.port for node in client.get_primaries()}
        chosen: dict[str, int] = {}
        for i in range(QUEUE_CANDIDATES):
            name = f"bench-{i}"
            port = client.get_node_from_key("{" + name + "}").port
            if port not in chosen.values():
                chosen[name] = port
            if len(chosen) == len(masters):
                return chosen
    finally:
        client.close()
    raise RuntimeError(
        f"no {len(masters)} queue names among {QUEUE_CANDIDATES} land on {len(masters)} masters"
    )


# The measures


@dataclass
class Target:
    """A Redis the workers drain from: its URL, a broker over it, its server processes."""

    url: str
    broker: Any
    enqueue: Callable[[list[Any]], Any]
    server_pids: list[int]


@dataclass(frozen=True)
class WorkerRun:
    queues: tuple[str, ...]
    count: int
    first: float
    last: float

    @property
    def rate(self) -> float:
        return self.count / (self.last - self.first) if self.last > self.first else 0.0


@dataclass(frozen=True)
class Drain:
    measure: str
    workers: tuple[WorkerRun, ...]
    enqueue_seconds: float
    #: CPU seconds of the workers, of the redis-servers and of the whole machine, from the
    #: resume until the last report was seen, and the wall seconds of that span.
    cpu_seconds: tuple[float, float, float]
    cpu_window: float

    @property
    def tasks(self) -> int:
        return sum(worker.count for worker in self.workers)

    @property
    def busy_workers(self) -> list[WorkerRun]:
        return [worker for worker in self.workers if worker.count]

    @property
    def seconds(self) -> float:
        return max(w.last for w in self.busy_workers) - min(w.first for w in self.busy_workers)

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds

    @property
    def start_spread(self) -> float:
        return max(w.first for w in self.busy_workers) - min(w.first for w in self.busy_workers)


def start_worker(url: str, prefix: str, queues: Sequence[str], concurrency: int) -> subprocess.Popen:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = SETTINGS
    env["BENCH_CLUSTER_REDIS_URL"] = url
    env["BENCH_CLUSTER_PREFIX"] = prefix
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "django", "rtq_worker",
        "--queues", ",".join(queues), "--concurrency", str(concurrency), "--loglevel", "WARNING",
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent
    )


def stop_workers(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(WORKER_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(
                f"worker {worker.pid} did not stop within {WORKER_STOP_TIMEOUT:.0f} s; killing it", flush=True
            )
            worker.kill()
            worker.wait()
        if worker.returncode != 0:
            print(f"worker {worker.pid} exited with code {worker.returncode}", flush=True)


def check_alive(workers: list[subprocess.Popen], when: str) -> None:
    for worker in workers:
        if worker.poll() is not None:
            raise RuntimeError(f"worker {worker.pid} exited with code {worker.returncode} {when}")


def wait_registered(broker: Any, workers: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    wanted = {worker.pid for worker in workers}
    while not wanted <= {info.get("pid") for info in broker.workers()}:
        check_alive(workers, "before registering")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not register within {WORKER_START_TIMEOUT:.0f} s")
        time.sleep(0.05)


def cpu_seconds(workers: Sequence[int], servers: Sequence[int]) -> tuple[float, float, float]:
    """CPU seconds used so far by the workers, by the redis-servers, and by the whole machine."""
    import psutil

    def of(pids: Sequence[int]) -> float:
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)

    machine = psutil.cpu_times()
    return of(workers), of(servers), sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)


def drain(
    measure: str,
    target: Target,
    plan: Sequence[Sequence[str]],
    tasks_per_queue: int,
    concurrency: int,
    prefix: str,
) -> Drain:
    """Enqueue tasks_per_queue tasks on each queue of the plan, then drain them with one worker
    process per entry of the plan (the queues it serves)."""
    from bench.cluster.tasks import empty, stats_keys

    broker, client = target.broker, target.broker.client
    queues = list(dict.fromkeys(queue for worker_queues in plan for queue in worker_queues))
    total = tasks_per_queue * len(queues)
    done_key, first_key, last_key = stats_keys()
    client.delete(done_key, first_key, last_key)
    for queue in queues:
        broker.pause(queue)
    messages = []
    for queue in queues:
        on_queue = empty.using(queue=queue)
        messages += [on_queue.prepare() for _ in range(tasks_per_queue)]
    started = time.perf_counter()
    target.enqueue(messages)
    enqueue_seconds = time.perf_counter() - started

    workers: list[subprocess.Popen] = []
    try:
        for worker_queues in plan:
            workers.append(start_worker(target.url, prefix, worker_queues, concurrency))
        wait_registered(broker, workers)
        pids = [worker.pid for worker in workers]
        cpu_before = cpu_seconds(pids, target.server_pids)
        resumed = time.perf_counter()
        for queue in queues:
            broker.resume(queue)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while (done := sum(int(count) for count in client.hvals(done_key))) < total:
            check_alive(workers, "while draining")
            if time.monotonic() > deadline:
                raise RuntimeError(f"drain timed out: {done} of {total} tasks done")
            time.sleep(POLL_INTERVAL)
        cpu_after = cpu_seconds(pids, target.server_pids)
        cpu_window = time.perf_counter() - resumed
        pipe = client.pipeline(transaction=False)
        for key in (done_key, first_key, last_key):
            pipe.hgetall(key)
        counts, firsts, lasts = pipe.execute()
    finally:
        stop_workers(workers)
    runs = tuple(
        WorkerRun(
            queues=tuple(worker_queues),
            count=int(counts.get(str(worker.pid), 0)),
            first=float(firsts.get(str(worker.pid), 0.0)),
            last=float(lasts.get(str(worker.pid), 0.0)),
        )
        for worker, worker_queues in zip(workers, plan, strict=True)
    )
    if sum(run.count for run in runs) != total:
        raise RuntimeError(
            f"the workers report {sum(run.count for run in runs)} tasks, {total} were enqueued"
        )
    return Drain(
        measure=measure,
        workers=runs,
        enqueue_seconds=enqueue_seconds,
        cpu_seconds=(
            cpu_after[0] - cpu_before[0],
            cpu_after[1] - cpu_before[1],
            cpu_after[2] - cpu_before[2],
        ),
        cpu_window=cpu_window,
    )


# Printing


def header_lines(servers: Servers, queues: dict[str, int], args: argparse.Namespace) -> list[str]:
    import django
    import redis

    try:
        import hiredis

        parser = f"hiredis {hiredis.__version__}"
    except ImportError:
        parser = "no hiredis"
    client = redis.Redis(port=servers.nodes[0].port, decode_responses=True)
    try:
        version = client.info("server").get("redis_version", "?")
    finally:
        client.close()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    ports = ", ".join(str(node.port) for node in servers.nodes)
    standalone = f"; a standalone redis-server on {servers.standalone.port}" if servers.standalone else ""
    placed = ", ".join(f"{queue} on :{port}" for queue, port in queues.items())
    return [
        f"bench: {platform.node()} ({platform.machine()}), {cores} cores, load average {load}",
        f"bench: Python {platform.python_version()}, Django {django.get_version()}, "
        f"redis-py {redis.__version__} ({parser}), Redis server {version}",
        f"bench: a Redis Cluster of {len(servers.nodes)} masters on 127.0.0.1 ports {ports} (no replicas, "
        f"no persistence){standalone}; servers and workers share the cores, unpinned",
        f"bench: queues {placed}; {args.tasks:,} empty tasks a queue, enqueued with enqueue_many; "
        f"workers of concurrency {args.concurrency}, the ORM mirror off",
    ]


def worker_name(index: int, run: WorkerRun, queues: dict[str, int]) -> str:
    if len(run.queues) == 1:
        port = queues.get(run.queues[0])
        return f"{run.queues[0]}" + (f" (:{port})" if port else "")
    return f"worker {index + 1}"


def drain_line(result: Drain, queues: dict[str, int]) -> str:
    line = (
        f"{LABELS[result.measure]}: {result.tasks:,} tasks in {result.seconds:.2f} s = {result.rate:,.0f}/s"
    )
    if len(result.workers) > 1:
        each = ", ".join(
            f"{worker_name(i, run, queues)} {run.count:,} in {run.last - run.first:.2f} s = {run.rate:,.0f}/s"
            for i, run in enumerate(result.workers)
        )
        line += f"; workers: {each}; start spread {result.start_spread * 1000:.0f} ms"
    cpu_workers, cpu_servers, cpu_machine = result.cpu_seconds
    rest = max(0.0, cpu_machine - cpu_workers - cpu_servers)
    line += (
        f"; CPU workers {cpu_workers:.2f} s + redis {cpu_servers:.2f} s = "
        f"{(cpu_workers + cpu_servers) / result.cpu_window:.2f} cores "
        f"({cpu_workers / result.tasks * 1e6:.0f} + {cpu_servers / result.tasks * 1e6:.0f} µs a task), "
        f"the rest of the machine {rest / result.cpu_window:.2f}"
        f"; enqueue_many {result.tasks:,} in {result.enqueue_seconds:.2f} s"
    )
    return line


def print_summary(results: dict[str, list[Drain]]) -> None:
    """Medians (with --repeat) and the ratios to one node's figure."""
    repeated = any(len(drains) > 1 for drains in results.values())
    rates = {
        measure: statistics.median(d.rate for d in drains) for measure, drains in results.items() if drains
    }
    if repeated:
        for measure, drains in results.items():
            if drains:
                spread = ", ".join(f"{d.rate:,.0f}" for d in drains)
                print(
                    f"median, {LABELS[measure]}: {rates[measure]:,.0f} tasks/s (runs: {spread})", flush=True
                )
    of = "medians" if repeated else "rates"
    one = rates[ONE_NODE]
    three = rates[THREE]
    print(f"ratio of {of}: 3 queues on 3 masters with 3 workers / one node = {three / one:.2f}x", flush=True)
    per_worker = [
        statistics.median(d.workers[i].rate for d in results[THREE])
        for i in range(len(results[THREE][0].workers))
    ]
    shares = ", ".join(f"{rate / one:.2f}x" for rate in per_worker)
    print(f"ratio of {of}: each of the 3 workers (own queue) / one node = {shares}", flush=True)
    if results.get(SHARED):
        print(
            f"ratio of {of}: 3 workers each on all 3 queues / one node = {rates[SHARED] / one:.2f}x; "
            f"/ 3 workers on one queue each = {rates[SHARED] / three:.2f}x",
            flush=True,
        )
    if results.get(STANDALONE):
        print(
            f"ratio of {of}: one node of the cluster / standalone redis-server, 1 queue 1 worker = "
            f"{one / rates[STANDALONE]:.2f}x",
            flush=True,
        )


def main() -> int:
    args = parse_args()
    use_repo_root()
    stop_on_sigterm()
    prefix = f"clusterbench-{uuid.uuid4().hex[:10]}"
    servers = Servers(nodes=[], standalone=None)
    began = time.monotonic()
    try:
        start_servers(servers, standalone=not args.skip_standalone)
        queues = pick_queues(servers.cluster_url)
        os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
        os.environ["BENCH_CLUSTER_REDIS_URL"] = servers.cluster_url
        os.environ["BENCH_CLUSTER_PREFIX"] = prefix
        import django

        django.setup()
        from django_rtq import enqueue_many, get_broker
        from django_rtq.broker import Broker
        from django_rtq.connection import redis_client

        cluster_broker = get_broker()
        for queue, port in queues.items():
            node = cluster_broker.client.get_node_from_key(cluster_broker.queue(queue).pending)
            if node.port != port:
                raise RuntimeError(f"queue {queue}'s keys are on :{node.port}, not :{port}")
        cluster = Target(
            url=servers.cluster_url,
            broker=cluster_broker,
            enqueue=enqueue_many,
            server_pids=[node.process.pid for node in servers.nodes],
        )
        standalone = None
        if servers.standalone:
            standalone_broker = Broker(redis_client(servers.standalone.url), prefix=prefix)
            standalone = Target(
                url=servers.standalone.url,
                broker=standalone_broker,
                enqueue=standalone_broker.enqueue,
                server_pids=[servers.standalone.process.pid],
            )

        for line in header_lines(servers, queues, args):
            print(line, flush=True)
        names = list(queues)
        measures: list[tuple[str, Target, list[list[str]]]] = [
            (ONE_NODE, cluster, [names[:1]]),
            (THREE, cluster, [[name] for name in names]),
        ]
        if not args.skip_shared:
            measures.append((SHARED, cluster, [names for _ in names]))
        if standalone:
            measures.append((STANDALONE, standalone, [names[:1]]))
        results: dict[str, list[Drain]] = {measure: [] for measure, _, _ in measures}
        for _ in range(args.repeat):
            for measure, target, plan in measures:
                result = drain(measure, target, plan, args.tasks, args.concurrency, prefix)
                results[measure].append(result)
                print(drain_line(result, queues), flush=True)
        print_summary(results)
        load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
        print(f"bench: {time.monotonic() - began:.0f} s; load average now {load}", flush=True)
        return 0
    finally:
        servers.stop()


if __name__ == "__main__":
    sys.exit(main())

"""django-rtq side by side with huey, Dramatiq, Celery and RQ on one Redis. A script, not a test.

Run from the repository root, with a Python that has redis-py and psutil (the test venv has):

    .venv-test/django6/bin/python bench/peers.py [--quick] [--only rtq,rtq-django,huey]
        [--handlers empty,incr,orm,sleep] [--enqueue-tasks 5000] [--drain-tasks 10000]
        [--drain-seconds 15] [--latency-tasks 300] [--memory-tasks 100000]
        [--concurrency 10] [--sleep-concurrency 50] [--processes 1,2] [--repeat 1] [--no-pin]
        [--rtt 0] [--handler-redis direct|proxy]

Systems: django-rtq through its own `@task` ("rtq") and through `django.tasks` ("rtq-django"),
both with the ORM mirror and the outbox off, and through `django.tasks` at django-rtq's defaults
("rtq-django-defaults": the mirror writes every finished task to PostgreSQL, the workers relay
the outbox), all three from the test venv (.venv-test/django6: Django 6, this checkout); huey,
Dramatiq, Celery and RQ, each installed from PyPI in its own virtualenv under .venv-bench/<peer>
(made with Python 3.12 from pyenv on the first run, reused after). Every system runs the same
task bodies (bench/peers/common.py): `empty`; `incr`, one Redis INCR on the handler's own
connection; `orm`, `SELECT 1` through Django's connection (PostgreSQL at 127.0.0.1:5432, user
postgres, database `test`); `sleep`, time.sleep(0.005). Its tasks and clients are in
bench/peers/<peer>_tasks.py (django-rtq's in bench/peers/tasks.py, its settings in
bench/peers/rtq_settings.py: the ORM mirror off, as no peer writes finished tasks to a
database, and the outbox off; bench/peers/rtq_defaults_settings.py leaves both on, and the run
migrates the database for it first and deletes the mirror's rows before each measurement);
bench/peers/driver.py enqueues, run with the system's own Python. (This file runs as a script
only: `bench.peers` is the package.)

The run starts a private redis-server on a free loopback port (no persistence) and stops it at
the end; every measurement starts from FLUSHALL. redis-server stays on one CPU and the drivers on
another (unless --no-pin): on a small VM a round trip within one core costs less than half of
one across cores, and left to the scheduler the enqueue rates jumped from run to run. A single
worker process drains on the drivers' CPU (idle meanwhile): left to the scheduler it sometimes
shared Redis's core, and one drain rate differed threefold between two runs. It is unpinned
before its latency is measured; two worker processes go where the scheduler puts them.

For each handler and system it measures: enqueueing one by one; one bulk call where the library
has one (django-rtq `enqueue_many`, RQ `enqueue_many`); draining `--drain-tasks` tasks enqueued
before the worker started, with one worker process and with two (`--processes`; rate = tasks
done / time from the first task's start to the last task's end, as the task bodies report them;
capped at `--drain-seconds` of work, marked `*`); the CPU time the worker's process tree spent a
task during the drain (from the first report of a task done to the last, so without the
start-up), and as a share of a core (near 100% with one process: CPU-bound); the RSS and PSS of
the worker's process tree after each drain; the latency of single tasks at an idle worker (from
before the enqueue call to the task's start, p50/p99). Then Redis's memory per small pending
task (`empty`, used_memory before and after `--memory-tasks` tasks). Workers: django-rtq
`rtq_worker --concurrency N --processes P`; huey `huey_consumer -k thread -w N` (P consumers);
Dramatiq `--processes P --threads N`; Celery `--pool threads --concurrency N` without gossip,
mingle and heartbeat (P workers); RQ `SimpleWorker` (P workers, one job at a time each, no fork
per job). N is `--concurrency`, `--sleep-concurrency` for `sleep`.

`--repeat N` makes every measurement N times, back to back (a run of the workers: the drain
with one process and its latency, then the drain with two), and prints each figure as the median
of its N runs with the lowest and the highest beside it (`7,391/s (6,950-7,610, median of 5)`,
with an en dash); ratios are of the medians.

`--rtt MS` puts a network between every system and Redis: bench/delay_proxy.py, a TCP proxy in a
process of its own (on redis-server's CPU, unless --no-pin: the network is on neither the
client's core nor the worker's), holds every chunk of bytes MS/2 each way before passing it on,
each chunk on its own clock and in order, so pipelined bytes keep flowing (a delay, not a
throttle) and no connection waits for another's. Every system's enqueueing clients and workers
reach Redis only through it. The measurement's own traffic goes straight to Redis: FLUSHALL,
the counts of completions, the latency stamps, and the filling of queues before a drain (a
second driver a system, straight to Redis: filling 10,000 tasks one round trip each would take
longer than the drain). The `incr` body's own INCR goes straight to Redis with
`--handler-redis direct` (the default: only the queue crosses the network, as when the task's
data lives beside the worker) or through the proxy with `--handler-redis proxy` (the task's own
I/O across the same network; issue 29's thread-bound ceiling is then threads / one round trip).
PostgreSQL (`orm`) is never behind the proxy. At the start the run prints the round trip the
proxy adds: the median of 500 PINGs through it minus that of 500 straight to Redis (the proxy's
own hop is in it; select()'s wake-ups make it a little more than MS). Each drain then prints
the requests a task the workers sent through the proxy (chunks to Redis from the first report to
the last task, over the tasks done meanwhile: a request or a pipeline of them is one chunk, so
about the round trips a task costs, the worker's housekeeping included) and the proxy's CPU, as
a share of a core (near 100%, it would be the bottleneck, not the delay). `--rtt 0`, the
default, runs without a proxy.

It prints the versions and the machine's load, a line per system and handler as it goes, then
a table per handler, its ratios to huey, and the figures issues 12 and 29 are judged on. On a
shared 2-core box the absolute numbers move by tens of percent from run to run: read the ratios,
and medians of several runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import redis

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_ROOT = REPO_ROOT / ".venv-bench"
DEFAULT_RTQ_PYTHON = REPO_ROOT / ".venv-test" / "django6" / "bin" / "python"
QUEUE = "bench"
#: Installed in each peer's virtualenv, besides what every one gets (COMMON_REQUIREMENTS).
PEER_REQUIREMENTS = {
    "huey": ["huey", "redis"],
    "dramatiq": ["dramatiq[redis]"],
    "celery": ["celery[redis]"],
    "rq": ["rq"],
}
COMMON_REQUIREMENTS = ["django", "psycopg[binary]", "hiredis"]
HANDLERS = ("empty", "incr", "orm", "sleep")
SLEEP_SECONDS = 0.005
#: Marks an answer of bench/peers/driver.py on its stdout.
REPLY = "@@bench "
POLL_INTERVAL = 0.01
#: Past the last report a drain waits this long, for reports still on their way (every 10 ms).
REPORT_SETTLE = 0.05
WORKER_START_TIMEOUT = 60.0
WORKER_STOP_TIMEOUT = 20.0
#: PINGs timed through the delay proxy, and straight, for the round trip it adds.
RTT_PINGS = 500
LATENCY_WARMUP = 20
#: Between the ends of a range of runs (RUF001 rejects the character itself in a string).
EN_DASH = "\u2013"
#: The private redis-server: loopback only, nothing saved.
SERVER_OPTIONS = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]
#: Sizes of a full run (under ~15 minutes on 2 cores) and of --quick (about 2 minutes).
FULL_SIZES = {
    "enqueue_tasks": 5000,
    "drain_tasks": 10_000,
    "drain_seconds": 15.0,
    "latency_tasks": 300,
    "memory_tasks": 100_000,
}
QUICK_SIZES = {
    "enqueue_tasks": 500,
    "drain_tasks": 1000,
    "drain_seconds": 2.0,
    "latency_tasks": 30,
    "memory_tasks": 5000,
}


#: How the tables name each system.
LABELS = {
    "rtq": "django-rtq @task",
    "rtq-django": "django-rtq django.tasks",
    "rtq-django-defaults": "django-rtq django.tasks, defaults",
    "huey": "huey",
    "dramatiq": "Dramatiq",
    "celery": "Celery",
    "rq": "RQ SimpleWorker¹",
}
LABEL_WIDTH = max(len(label) for label in LABELS.values())
#: django-rtq's systems, all run by the test venv's Python, by their settings module.
RTQ_SETTINGS = {
    "rtq": "bench.peers.rtq_settings",
    "rtq-django": "bench.peers.rtq_settings",
    "rtq-django-defaults": "bench.peers.rtq_defaults_settings",
}
#: Those whose database needs django-rtq's tables (the ORM mirror, the outbox): migrated first.
MIGRATED = ("rtq-django-defaults",)


@dataclass(frozen=True)
class System:
    name: str
    label: str
    python: Path
    settings: str
    one_at_a_time: bool = False  # RQ: a process runs one job at a time, whatever --concurrency
    migrate: bool = False  # `django migrate` with its settings before its first use


@dataclass(frozen=True)
class Figure:
    """One figure measured once a run (--repeat runs): printed as the median of the runs."""

    samples: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Figure | None:
        """The figure of the runs that gave a value, or None if none did."""
        samples = tuple(value for value in values if value is not None)
        return cls(samples) if samples else None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def text(self, form: Callable[[float], str], suffix: str = "", count: bool = False) -> str:
        """The median, and beside it the lowest and the highest of the runs if there were several
        and they differ as written (and how many, if `count`)."""
        notes = []
        if len(self.samples) > 1:
            low, high = form(min(self.samples)), form(max(self.samples))
            if low != high:
                notes.append(f"{low}{EN_DASH}{high}")
            if count:
                notes.append(f"median of {len(self.samples)}")
        return form(self.median) + suffix + (f" ({', '.join(notes)})" if notes else "")


@dataclass
class Drain:
    done: int
    seconds: float
    capped: bool
    spread: float  # seconds between the first and the last process's first task
    rss: float  # MiB, the worker's whole process tree
    pss: float  # MiB, the same tree's proportional set size (shared pages divided among sharers)
    proxy_cpu: float | None = None  # the delay proxy's CPU time over the drain's, in cores (--rtt)
    requests: float | None = None  # requests (or pipelines) sent through the proxy a task (--rtt)
    worker_cpu: float = 0.0  # the worker's process tree: CPU seconds a task
    worker_load: float = 0.0  # the same tree's CPU time over the drain's, in cores

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Latency:
    p50: float  # seconds
    p99: float


@dataclass
class Row:
    system: System
    handler: str
    concurrency: int
    enqueue: Figure | None = None  # tasks/s
    bulk: Figure | None = None
    bulk_call: str | None = None
    drains: dict[int, list[Drain]] = field(default_factory=dict)  # by processes, one a run
    latencies: list[Latency] = field(default_factory=list)  # one a run
    seconds: float = 0.0  # what measuring the row took (all its runs)

    def drain(self, processes: int, value: Callable[[Drain], float | None]) -> Figure | None:
        """A figure of the drains with `processes` worker processes, or None without any."""
        return Figure.of(value(drain) for drain in self.drains.get(processes, []))

    def capped(self, processes: int) -> bool:
        return any(drain.capped for drain in self.drains.get(processes, []))

    @property
    def p50(self) -> Figure | None:
        return Figure.of(latency.p50 for latency in self.latencies)

    @property
    def p99(self) -> Figure | None:
        return Figure.of(latency.p99 for latency in self.latencies)


@dataclass
class Memory:
    system: System
    tasks: int
    used: int  # bytes, INFO memory used_memory after - before
    keys: int
    key_bytes: int  # MEMORY USAGE summed over every key
    kinds: dict[str, int] = field(default_factory=dict)  # MEMORY USAGE by kind of key (key_kind)


# --- setting up ---------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of ~2 minutes")
    parser.add_argument(
        "--only", default=",".join([*RTQ_SETTINGS, *PEER_REQUIREMENTS]), help="systems, by name"
    )
    parser.add_argument("--handlers", default=",".join(HANDLERS), help="task bodies")
    parser.add_argument("--enqueue-tasks", type=int, help="tasks enqueued one by one, and in bulk")
    parser.add_argument("--drain-tasks", type=int, help="tasks per drain")
    parser.add_argument("--drain-seconds", type=float, help="longest time a drain is timed for")
    parser.add_argument("--latency-tasks", type=int, help="tasks timed one at a time")
    parser.add_argument("--latency-gap", type=float, default=0.002, help="seconds between latency tasks")
    parser.add_argument("--memory-tasks", type=int, help="pending tasks for Redis's memory per task")
    parser.add_argument("--concurrency", type=int, default=10, help="threads per worker process")
    parser.add_argument("--sleep-concurrency", type=int, default=50, help="threads for the sleep handler")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of every measurement; the median is printed, with the range",
    )
    parser.add_argument("--rtq-python", type=Path, default=DEFAULT_RTQ_PYTHON, help="django-rtq's Python")
    parser.add_argument("--base-python", type=Path, help="Python that makes the peers' virtualenvs")
    parser.add_argument("--redis-server", default="/usr/bin/redis-server", help="redis-server binary")
    parser.add_argument(
        "--processes",
        default="1,2",
        help="worker processes of the drains, e.g. 1 or 1,2 (the latency is measured with one)",
    )
    parser.add_argument(
        "--rtt",
        type=float,
        default=0.0,
        help="milliseconds of round trip a delay proxy adds in front of Redis (0: no proxy)",
    )
    parser.add_argument(
        "--handler-redis",
        choices=("direct", "proxy"),
        default="direct",
        help="with --rtt: the incr body's own Redis I/O goes straight to Redis or through the proxy",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave redis-server and the enqueueing drivers wherever the scheduler puts them",
    )
    args = parser.parse_args()
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    args.handlers = [name.strip() for name in args.handlers.split(",") if name.strip()]
    unknown = sorted(set(args.handlers) - set(HANDLERS))
    if unknown:
        parser.error(f"unknown handlers: {', '.join(unknown)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    try:
        args.processes = sorted({int(p) for p in args.processes.split(",") if p.strip()})
    except ValueError:
        parser.error("--processes: numbers separated by commas")
    if not args.processes or min(args.processes) < 1:
        parser.error("--processes: at least one worker process")
    if args.rtt < 0:
        parser.error("--rtt must not be negative")
    return args


def pyenv_python312() -> Path:
    """The newest Python 3.12 that pyenv has."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = str(Path.home() / ".pyenv")
    found = sorted(
        glob.glob(f"{root}/versions/3.12*/bin/python3"),
        key=lambda p: [int(x) for x in Path(p).parent.parent.name.split(".") if x.isdigit()],
    )
    if not found:
        raise SystemExit(f"no Python 3.12 under {root}/versions: pass --base-python")
    return Path(found[-1])


def ensure_venv(peer: str, base_python: Path) -> Path:
    """The peer's virtualenv under .venv-bench/, made and pip-installed from PyPI unless it is
    there with the same requirements already; returns its Python."""
    venv = VENV_ROOT / peer
    python = venv / "bin" / "python"
    wanted = [*PEER_REQUIREMENTS[peer], *COMMON_REQUIREMENTS]
    marker = venv / "bench-requirements.txt"
    if python.exists() and marker.exists() and marker.read_text().split() == wanted:
        return python
    print(f"bench: making {venv.relative_to(REPO_ROOT)}: pip install {' '.join(wanted)}", flush=True)
    subprocess.run([str(base_python), "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted], check=True)
    marker.write_text("\n".join(wanted) + "\n")
    return python


def make_systems(args: argparse.Namespace) -> list[System]:
    known = [*RTQ_SETTINGS, *PEER_REQUIREMENTS]
    unknown = sorted(set(args.only) - set(known))
    if unknown:
        raise SystemExit(f"unknown systems: {', '.join(unknown)} (known: {', '.join(known)})")
    base_python = None
    systems = []
    for name in [name for name in known if name in args.only]:
        if name in RTQ_SETTINGS:
            settings = RTQ_SETTINGS[name]
            systems.append(System(name, LABELS[name], args.rtq_python, settings, migrate=name in MIGRATED))
        else:
            base_python = base_python or args.base_python or pyenv_python312()
            python = ensure_venv(name, base_python)
            systems.append(
                System(name, LABELS[name], python, "bench.peers.settings", one_at_a_time=name == "rq")
            )
    return systems


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def private_redis(binary: str, cpu: int | None) -> Iterator[str]:
    """A redis-server of this run alone, on a free loopback port, without persistence (and
    kept on one CPU, if `cpu` is given)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="peersbench-redis-") as directory:
        server = subprocess.Popen(
            [binary, *SERVER_OPTIONS, "--port", str(port), "--dir", directory],
            stdout=subprocess.DEVNULL,
        )
        if cpu is not None:
            os.sched_setaffinity(server.pid, {cpu})
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = redis.Redis.from_url(url)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not start on port {port}") from None
                    time.sleep(0.05)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@dataclass(frozen=True)
class RoundTrip:
    """PING round trips through the delay proxy and straight to Redis, p50 in seconds."""

    proxied: float
    direct: float
    pings: int

    @property
    def added(self) -> float:
        return self.proxied - self.direct


@dataclass(frozen=True)
class Network:
    """Where each kind of traffic goes. The systems queue on `queue` (the delay proxy's address
    with --rtt, else Redis's); the incr body's own I/O goes to `handler`; the measurement's own
    traffic (FLUSHALL, the counts, the latency stamps, the filling of queues before a drain)
    goes straight to Redis, `direct`, so it never pays the simulated network."""

    direct: str
    queue: str
    handler: str
    proxy: DelayProxy | None = None
    round_trip: RoundTrip | None = None


class DelayProxy:
    """The running bench/delay_proxy.py: its CPU time, and the chunks its clients sent."""

    def __init__(self, process: subprocess.Popen) -> None:
        self._popen = process
        self._process = psutil.Process(process.pid)

    def cpu_seconds(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system

    def requests(self) -> int:
        """Chunks sent to Redis through it so far: a request (or a pipeline) each."""
        assert self._popen.stdout is not None
        self._popen.send_signal(signal.SIGUSR1)
        words = self._popen.stdout.readline().split()
        if len(words) < 2 or words[0] != "chunks":
            raise RuntimeError(f"the delay proxy answered {words!r}")
        return int(words[1])


def ping_p50(url: str, pings: int) -> float:
    """The median of `pings` PING round trips on one connection, in seconds."""
    client = redis.Redis.from_url(url)
    try:
        for _ in range(10):  # connect, warm up
            client.ping()
        seconds = []
        for _ in range(pings):
            start = time.perf_counter()
            client.ping()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds)
    finally:
        client.close()


@contextlib.contextmanager
def delay_proxy(direct_url: str, rtt_ms: float, cpu: int | None) -> Iterator[tuple[str, DelayProxy]]:
    """bench/delay_proxy.py in front of the private Redis, half of `rtt_ms` each way, in a process
    of its own (kept on `cpu`, if given); yields its Redis URL and its process."""
    target = redis.connection.parse_url(direct_url)
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "delay_proxy.py"),
            "--target",
            f"{target['host']}:{target['port']}",
            "--delay-ms",
            repr(rtt_ms / 2),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if cpu is not None:
            os.sched_setaffinity(proxy.pid, {cpu})
        assert proxy.stdout is not None
        line = proxy.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            raise RuntimeError(f"the delay proxy did not start (it said {line!r})")
        port = int(line[1].rpartition(":")[2])
        yield f"redis://127.0.0.1:{port}/{target.get('db', 0)}", DelayProxy(proxy)
    finally:
        proxy.terminate()
        try:
            proxy.wait(10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()


def system_env(system: System, network: Network, prefix: str, queue_url: str | None = None) -> dict[str, str]:
    """The environment of the system's processes; `queue_url` instead of the network's queue
    for a driver that fills queues straight."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(REPO_ROOT),
        DJANGO_SETTINGS_MODULE=system.settings,
        BENCH_REDIS_URL=queue_url or network.queue,
        BENCH_REPORT_REDIS_URL=network.direct,
        BENCH_HANDLER_REDIS_URL=network.handler,
        BENCH_PREFIX=prefix,
    )
    return env


def migrate(system: System, network: Network, prefix: str, logs: Path) -> None:
    """django-rtq's tables in the system's database: `django migrate` with its settings and
    environment (its output in the run's logs); exits saying so if it fails."""
    command = [str(system.python), "-m", "django", "migrate", "--noinput"]
    env = system_env(system, network, prefix)
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise SystemExit(f"bench: {system.name}: cannot run `django migrate` ({exc})") from None
    (logs / f"migrate-{system.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise SystemExit(
            f"bench: {system.name} needs django-rtq's tables, and `django migrate` with"
            f" {system.settings} failed (exit code {done.returncode}); is PostgreSQL up at 127.0.0.1:5432"
            f" with database {env.get('BENCH_PG_DB', 'test')}? Its last lines:\n{output}"
        )


class Driver:
    """bench/peers/driver.py in the system's own Python: it enqueues, on command."""

    def __init__(self, system: System, env: dict[str, str], log: Path, cpu: int | None) -> None:
        self.system = system
        self._log = log.open("a")
        self._process = subprocess.Popen(
            [str(system.python), "-m", "bench.peers.driver", system.name],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        if cpu is not None:
            os.sched_setaffinity(self._process.pid, {cpu})
        self.hello = self._answer()
        #: The driver that fills queues before a drain: this one, or one straight to Redis (--rtt).
        self.filler = self

    def _answer(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(REPLY):
                answer = json.loads(line[len(REPLY) :])
                if "error" in answer:
                    raise RuntimeError(f"{self.system.name} driver: {answer['error']}")
                return answer
        raise RuntimeError(f"the {self.system.name} driver exited (its log: {self._log.name})")

    def call(self, action: str, **args: Any) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps({"action": action, "args": args}) + "\n")
        self._process.stdin.flush()
        return self._answer()

    def fill(self, handler: str, count: int) -> None:
        self.filler.call("fill", handler=handler, count=count)

    def reset(self) -> None:
        self.call("reset")
        if self.filler is not self:
            self.filler.call("reset")

    def close(self) -> None:
        if self.filler is not self:
            self.filler.close()
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()


# --- workers ------------------------------------------------------------------------------


def worker_commands(system: System, processes: int, concurrency: int, redis_url: str) -> list[list[str]]:
    """The command line(s) that run `processes` worker processes of `concurrency` threads."""
    python, bin_dir = str(system.python), system.python.parent
    threads, procs = str(concurrency), str(processes)
    if system.name in RTQ_SETTINGS:
        rtq = [python, "-m", "django", "rtq_worker", "--queues", QUEUE, "--loglevel", "WARNING"]
        return [[*rtq, "--concurrency", threads, "--processes", procs]]
    if system.name == "huey":
        huey = [str(bin_dir / "huey_consumer"), "bench.peers.huey_tasks.huey", "-k", "thread", "-n", "-q"]
        return [[*huey, "-w", threads] for _ in range(processes)]
    if system.name == "dramatiq":
        dramatiq = [str(bin_dir / "dramatiq"), "bench.peers.dramatiq_tasks", "--queues", QUEUE]
        return [[*dramatiq, "--processes", procs, "--threads", threads]]
    if system.name == "celery":
        celery = [str(bin_dir / "celery"), "-A", "bench.peers.celery_tasks", "worker", "-Q", QUEUE]
        options = ["--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"]
        return [
            [*celery, *options, "--pool", "threads", "--concurrency", threads, "-n", f"bench{i}@%h"]
            for i in range(processes)
        ]
    if system.name == "rq":
        rq = [str(bin_dir / "rq"), "worker", "-w", "rq.worker.SimpleWorker", "--url", redis_url]
        run = uuid.uuid4().hex[:8]
        return [[*rq, "--logging_level", "WARNING", "-n", f"bench{i}-{run}", QUEUE] for i in range(processes)]
    raise ValueError(system.name)


def start_workers(commands: list[list[str]], env: dict[str, str], log: Path) -> list[subprocess.Popen]:
    with log.open("a") as out:
        return [
            subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=out, start_new_session=True)
            for command in commands
        ]


def stop_workers(workers: list[subprocess.Popen]) -> None:
    """SIGTERM each worker, wait, then kill what is left of each one's process group."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_TIMEOUT
    for worker in workers:
        try:
            worker.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(
                f"bench: worker {worker.pid} did not stop within {WORKER_STOP_TIMEOUT:.0f} s; killed",
                flush=True,
            )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)  # its own session: children it left behind too
        worker.wait()


def tree_memory_mib(workers: list[subprocess.Popen]) -> tuple[float, float]:
    """RSS and PSS of the workers and all their descendants, in MiB. RSS counts the pages a
    forked child shares with its parent twice; PSS divides them among the processes."""
    rss = pss = 0
    for worker in workers:
        try:
            process = psutil.Process(worker.pid)
            members = [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                info = member.memory_full_info()
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
    return rss / 2**20, pss / 2**20


def tree_cpu_seconds(workers: list[subprocess.Popen]) -> float:
    """CPU time (user and system) of the workers and all their descendants so far."""
    seconds = 0.0
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(worker.pid)
            for member in [process, *process.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = member.cpu_times()
                    seconds += times.user + times.system
    return seconds


def check_alive(workers: list[subprocess.Popen], log: Path) -> None:
    for worker in workers:
        if worker.poll() is not None:
            raise RuntimeError(f"a worker exited with code {worker.returncode} (its log: {log})")


# --- measurements -------------------------------------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace
    client: redis.Redis  # straight to Redis
    network: Network
    prefix: str
    logs: Path

    def fresh(self, driver: Driver) -> None:
        """An empty Redis for the next measurement (no worker may be running)."""
        self.client.flushall()
        driver.reset()

    def concurrency(self, handler: str) -> int:
        return self.args.sleep_concurrency if handler == "sleep" else self.args.concurrency

    def repeat(self, measure: Callable[[], T]) -> list[T]:
        """What `measure` gives in each of --repeat runs, made back to back."""
        return [measure() for _ in range(self.args.repeat)]


def measure_enqueue(ctx: Context, driver: Driver, handler: str) -> float:
    """Tasks/s of enqueue calls one after the other."""
    n = ctx.args.enqueue_tasks
    ctx.fresh(driver)
    driver.call("enqueue", handler=handler, count=min(100, n))  # warm-up: imports, connections
    ctx.fresh(driver)
    seconds = driver.call("enqueue", handler=handler, count=n)["seconds"]
    return n / seconds


def measure_bulk(ctx: Context, driver: Driver, handler: str) -> float | None:
    """Tasks/s of one bulk call (building the tasks included), or None without a bulk call."""
    n = ctx.args.enqueue_tasks
    ctx.fresh(driver)
    seconds = driver.call("bulk", handler=handler, count=n)["seconds"]
    return None if seconds is None else n / seconds


def read_reports(client: redis.Redis) -> tuple[int, list[float], list[float]]:
    from bench.peers import common

    pipe = client.pipeline(transaction=False)
    pipe.get(common.DONE_KEY)
    pipe.hvals(common.FIRST_KEY)
    pipe.hvals(common.LAST_KEY)
    done, firsts, lasts = pipe.execute()
    return int(done or 0), [float(v) for v in firsts], [float(v) for v in lasts]


def wait_for_drain(ctx: Context, workers: list[subprocess.Popen], n: int, log: Path) -> Drain:
    """Wait for n tasks done (or --drain-seconds after the first); the drain as reported."""
    from bench.peers import common

    proxy = ctx.network.proxy
    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while not (started := int(ctx.client.get(common.DONE_KEY) or 0)):
        check_alive(workers, log)
        if time.monotonic() > deadline:
            raise RuntimeError(f"no task done {WORKER_START_TIMEOUT:.0f} s after the worker started ({log})")
        time.sleep(POLL_INTERVAL)
    # from the first report on: the workers' start-up is not the drain's
    clock, worker_cpu = time.monotonic(), tree_cpu_seconds(workers)
    at_start = (proxy.cpu_seconds(), proxy.requests()) if proxy else None
    cap = time.monotonic() + ctx.args.drain_seconds
    while (reported := int(ctx.client.get(common.DONE_KEY) or 0)) < n and time.monotonic() < cap:
        check_alive(workers, log)
        time.sleep(POLL_INTERVAL)
    elapsed, worked = time.monotonic() - clock, max(1, reported - started)
    worker_cpu = tree_cpu_seconds(workers) - worker_cpu
    proxy_cpu = requests = None
    if proxy and at_start:
        proxy_cpu = (proxy.cpu_seconds() - at_start[0]) / elapsed
        requests = (proxy.requests() - at_start[1]) / worked
    time.sleep(REPORT_SETTLE)
    done, firsts, lasts = read_reports(ctx.client)
    rss, pss = tree_memory_mib(workers)
    return Drain(
        done=done,
        seconds=max(lasts) - min(firsts),
        capped=done < n,
        spread=max(firsts) - min(firsts),
        rss=rss,
        pss=pss,
        proxy_cpu=proxy_cpu,
        requests=requests,
        worker_cpu=worker_cpu / worked,
        worker_load=worker_cpu / elapsed,
    )


def measure_latency(ctx: Context, driver: Driver, handler: str) -> Latency:
    """p50 and p99 of single tasks sent to the idle worker that runs now."""
    answer = driver.call(
        "latency",
        handler=handler,
        count=ctx.args.latency_tasks,
        warmup=LATENCY_WARMUP,
        gap=ctx.args.latency_gap,
    )
    latencies = answer["latencies"]
    return Latency(percentile(latencies, 50), percentile(latencies, 99))


def one_process_pinned(commands: list[list[str]], processes: int, ctx: Context) -> list[list[str]]:
    """One worker process is kept (with any process it starts) on the drivers' CPU, which is idle
    while workers drain: otherwise the scheduler sometimes puts it on Redis's CPU, and the two
    share one core. Two processes go where the scheduler puts them (they need both cores)."""
    if processes != 1 or ctx.args.driver_cpu is None:
        return commands
    return [["taskset", "-c", str(ctx.args.driver_cpu), *command] for command in commands]


def unpin(workers: list[subprocess.Popen]) -> None:
    """Let workers, their descendants and all their threads run on every CPU again."""
    cpus = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(worker.pid)
            for member in [process, *process.children(recursive=True)]:
                command = ["taskset", "--all-tasks", "--pid", "--cpu-list", cpus, str(member.pid)]
                subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def measure_workers(ctx: Context, driver: Driver, row: Row) -> tuple[dict[int, Drain], Latency]:
    """Drains with one and two processes (by processes); the latency with one, at the same worker
    once idle (at a fresh one if the drain was capped and left tasks behind)."""
    system, handler, n = row.system, row.handler, ctx.args.drain_tasks
    env = system_env(system, ctx.network, ctx.prefix)
    log = ctx.logs / f"worker-{system.name}-{handler}.log"
    drains: dict[int, Drain] = {}
    latency = None
    for processes in ctx.args.processes:
        ctx.fresh(driver)
        driver.fill(handler, n)
        commands = worker_commands(system, processes, row.concurrency, ctx.network.queue)
        workers = start_workers(one_process_pinned(commands, processes, ctx), env, log)
        try:
            drains[processes] = wait_for_drain(ctx, workers, n, log)
            if processes == 1 and not drains[processes].capped:
                unpin(workers)  # the latency is measured as the scheduler would place the worker
                latency = measure_latency(ctx, driver, handler)
        finally:
            stop_workers(workers)
    if latency is None:
        ctx.fresh(driver)
        workers = start_workers(worker_commands(system, 1, row.concurrency, ctx.network.queue), env, log)
        try:
            latency = measure_latency(ctx, driver, handler)
        finally:
            stop_workers(workers)
    return drains, latency


def measure_memory(ctx: Context, driver: Driver) -> Memory:
    """Redis's memory for `--memory-tasks` pending `empty` tasks, enqueued the fastest way."""
    n = ctx.args.memory_tasks
    ctx.fresh(driver)
    before = int(ctx.client.info("memory")["used_memory"])
    driver.fill("empty", n)
    used = int(ctx.client.info("memory")["used_memory"]) - before
    memory = Memory(driver.system, n, used, keys=0, key_bytes=0)
    batch: list[bytes] = []
    for key in [*ctx.client.scan_iter(count=1000), None]:
        if key is not None:
            batch.append(key)
        if batch and (key is None or len(batch) >= 1000):
            pipe = ctx.client.pipeline(transaction=False)
            for name in batch:
                pipe.memory_usage(name, samples=0)
            for name, size in zip(batch, pipe.execute(), strict=True):
                kind = key_kind(name.decode(errors="replace"), ctx.prefix)
                memory.kinds[kind] = memory.kinds.get(kind, 0) + (size or 0)
                memory.key_bytes += size or 0
            memory.keys += len(batch)
            batch.clear()
    ctx.client.flushall()
    return memory


def key_kind(key: str, prefix: str) -> str:
    """A key without the run's prefix, its parts that look like ids as `*`: rq:job:<id> -> rq:job:*."""
    parts = key.removeprefix(prefix).lstrip(":").split(":")
    return ":".join(
        "*" if len(part) >= 16 and sum(c.isdigit() for c in part) >= 4 else part for part in parts
    )


def measure_row(ctx: Context, driver: Driver, handler: str) -> Row:
    started = time.monotonic()
    row = Row(driver.system, handler, 1 if driver.system.one_at_a_time else ctx.concurrency(handler))
    row.enqueue = Figure.of(ctx.repeat(lambda: measure_enqueue(ctx, driver, handler)))
    row.bulk = Figure.of(ctx.repeat(lambda: measure_bulk(ctx, driver, handler)))
    row.bulk_call = driver.hello["bulk"]
    for drains, latency in ctx.repeat(lambda: measure_workers(ctx, driver, row)):
        for processes, drain in drains.items():
            row.drains.setdefault(processes, []).append(drain)
        row.latencies.append(latency)
    row.seconds = time.monotonic() - started
    return row


# --- printing -----------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * p // 100)))
    return ordered[int(rank) - 1]


def whole(value: float) -> str:
    return f"{value:,.0f}"


def ms(value: float) -> str:
    return f"{value * 1000:.2f}" if value < 0.01 else f"{value * 1000:.1f}"


def shown(
    figure: Figure | None, form: Callable[[float], str] = whole, suffix: str = "", count: bool = False
) -> str:
    """The figure as Figure.text writes it, or — without one."""
    return "—" if figure is None else figure.text(form, suffix, count)


def rate(drain: Drain) -> float:
    return drain.rate


def rss(drain: Drain) -> float:
    return drain.rss


def pss(drain: Drain) -> float:
    return drain.pss


def proxy_cpu(drain: Drain) -> float | None:
    return drain.proxy_cpu


def requests(drain: Drain) -> float | None:
    return drain.requests


def drain_text(row: Row, processes: int, suffix: str = "") -> str:
    """The drain rate, marked * if a run was capped."""
    return shown(row.drain(processes, rate), suffix=("*" if row.capped(processes) else "") + suffix)


def ratio(value: Figure | None, base: Figure | None) -> str:
    return "—" if value is None or base is None or not base.median else f"{value.median / base.median:.2f}x"


def header_lines(systems: list[System], hellos: dict[str, dict[str, Any]], client: redis.Redis) -> list[str]:
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    ci = subprocess.run(["pgrep", "-f", "bash .ci/run"], capture_output=True).returncode == 0
    lines = [
        f"bench: {platform.node()}, {os.cpu_count()} cores, load average {load}"
        f"{' (a CI run is going on)' if ci else ''}; Redis server {client.info('server')['redis_version']}"
        " (private, no persistence)",
    ]
    seen: set[str] = set()
    for system in systems:
        versions = hellos[system.name]["versions"]
        text = ", ".join(f"{name} {version}" for name, version in versions.items())
        if text not in seen:  # django-rtq's systems share one Python
            seen.add(text)
            lines.append(f"bench: {'rtq' if system.name in RTQ_SETTINGS else system.name}: {text}")
    return lines


def repeat_line(repeat: int) -> str:
    if repeat == 1:
        return "bench: every figure is from one run of its measurement (--repeat 1)"
    return (
        f"bench: every figure is the median of {repeat} runs of its measurement, made back to back,"
        f" with their range (min{EN_DASH}max) beside it; ratios are of the medians"
    )


def progress_line(row: Row) -> str:
    parts = [
        f"{row.handler:<5} {row.system.label:<{LABEL_WIDTH}}",
        f"enqueue {shown(row.enqueue, suffix='/s')}",
    ]
    if row.bulk is not None:
        parts.append(f"bulk ({row.bulk_call}) {shown(row.bulk, suffix='/s')}")

    def figure(
        processes: int, value: Callable[[Drain], float | None], form: Callable[[float], str], unit: str
    ) -> str:
        return shown(row.drain(processes, value), form, unit)

    for p in sorted(row.drains):
        parts.append(
            f"drain {p}p {drain_text(row, p, '/s')}: {figure(p, lambda d: d.done, whole, ' tasks')}"
            f" in {figure(p, lambda d: d.seconds, '{:.2f}'.format, ' s')},"
            f" start spread {figure(p, lambda d: d.spread * 1000, '{:.0f}'.format, ' ms')},"
            f" RSS {figure(p, rss, '{:.0f}'.format, ' MiB')}, PSS {figure(p, pss, '{:.0f}'.format, ' MiB')},"
            f" worker CPU {figure(p, lambda d: d.worker_cpu * 1e6, whole, ' µs')} a task"
            f" ({figure(p, lambda d: d.worker_load, '{:.0%}'.format, ' of a core')})"
            + (
                f", {figure(p, requests, '{:.2f}'.format, '')} requests a task through the delay proxy,"
                f" its CPU {figure(p, proxy_cpu, '{:.0%}'.format, ' of a core')}"
                if row.drain(p, proxy_cpu)
                else ""
            )
        )
    parts.append(
        f"latency p50 {shown(row.p50, ms, ' ms')}, p99 {shown(row.p99, ms, ' ms')} ({row.seconds:.0f} s)"
    )
    return "; ".join(parts)


COLUMNS = (
    "system",
    "enqueue/s",
    "bulk/s",
    "drain/s 1p",
    "drain/s 2p",
    "p50 ms",
    "p99 ms",
)
MEMORY_COLUMNS = ("RSS MiB 1p", "PSS MiB 1p", "RSS MiB 2p", "PSS MiB 2p")


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


def values(row: Row) -> list[str]:
    return [
        row.system.label,
        shown(row.enqueue),
        shown(row.bulk),
        drain_text(row, 1),
        drain_text(row, 2),
        shown(row.p50, ms),
        shown(row.p99, ms),
        shown(row.drain(1, rss)),
        shown(row.drain(1, pss)),
        shown(row.drain(2, rss)),
        shown(row.drain(2, pss)),
    ]


def ratios_to(row: Row, base: Row) -> list[str]:
    return [
        row.system.label,
        ratio(row.enqueue, base.enqueue),
        ratio(row.bulk, base.bulk),
        ratio(row.drain(1, rate), base.drain(1, rate)),
        ratio(row.drain(2, rate), base.drain(2, rate)),
        ratio(row.p50, base.p50),
        ratio(row.p99, base.p99),
        ratio(row.drain(1, rss), base.drain(1, rss)),
        ratio(row.drain(2, rss), base.drain(2, rss)),
    ]


def handler_tables(handler: str, rows: list[Row], ctx: Context) -> list[str]:
    threads = ctx.concurrency(handler)
    lines = [
        "",
        f"== handler {handler}: {threads} threads a worker process (RQ: 1 job at a time), "
        f"drains of {ctx.args.drain_tasks:,} tasks",
    ]
    lines += table([[*COLUMNS, *MEMORY_COLUMNS], *[values(row) for row in rows]])
    huey = next((row for row in rows if row.system.name == "huey"), None)
    if huey is not None:
        lines += ["ratios to huey (rates: >1 is faster; latency and RSS: <1 is less):"]
        lines += table(
            [[*COLUMNS, "RSS 1p", "RSS 2p"], *[ratios_to(row, huey) for row in rows if row is not huey]]
        )
    if handler == "sleep":
        ideal = threads / SLEEP_SECONDS
        lines.append(
            f"ideal: {threads} threads / 5 ms = {ideal:,.0f}/s a process ({2 * ideal:,.0f}/s with 2)"
        )
        for row in rows:
            one, two = row.drain(1, lambda d: d.rate / ideal), row.drain(2, lambda d: d.rate / (2 * ideal))
            if one and two:
                lines.append(
                    f"  {row.system.label:<{LABEL_WIDTH}} {shown(one, '{:.1%}'.format)} of the ideal with"
                    f" 1 process, {shown(two, '{:.1%}'.format)} with 2"
                )
    return lines


def memory_lines(memories: list[list[Memory]]) -> list[str]:
    """A line per system of its runs of measure_memory."""
    if not memories:
        return []
    rows = [["system", "pending tasks", "used_memory +", "bytes a task", "keys", "MEMORY USAGE a task"]]
    for runs in memories:
        rows.append(
            [
                runs[0].system.label,
                f"{runs[0].tasks:,}",
                shown(Figure.of(m.used / 2**20 for m in runs), "{:,.1f}".format, " MiB"),
                shown(Figure.of(m.used / m.tasks for m in runs)),
                shown(Figure.of(m.keys for m in runs)),
                shown(Figure.of(m.key_bytes / m.tasks for m in runs)),
            ]
        )
    lines = ["", "== Redis memory per small pending task (empty, enqueued the fastest way)", *table(rows)]
    lines.append("MEMORY USAGE a task, by key (the biggest four):")
    for runs in memories:
        kinds = {kind for m in runs for kind in m.kinds}
        figures = {kind: Figure(tuple(m.kinds.get(kind, 0) / m.tasks for m in runs)) for kind in kinds}
        biggest = sorted(figures.items(), key=lambda item: -item[1].median)[:4]
        text = ", ".join(f"{kind} {figure.text(whole)}" for kind, figure in biggest)
        lines.append(f"  {runs[0].system.label}: {text}")
    return lines


def find(rows: list[Row], system: str, handler: str) -> Row | None:
    return next((r for r in rows if r.system.name == system and r.handler == handler), None)


def pooled(rows: list[Row], system: str, value: Callable[[Row], Figure | None]) -> Figure | None:
    """Every run of a figure over the system's rows (one a handler) as one figure, or None."""
    return Figure.of(
        sample
        for r in rows
        if r.system.name == system and (f := value(r)) is not None
        for sample in f.samples
    )


def drain_rate(row: Row | None, processes: int) -> Figure | None:
    return row.drain(processes, rate) if row else None


def compared(a: Figure | None, b: Figure | None, text: str) -> list[str]:
    """A line comparing two rates, if there are both: `text` with {a} and {b} (their figures)
    and {r} (a / b); else none."""
    if a is None or b is None:
        return []
    a_text, b_text = a.text(whole, "/s", count=True), b.text(whole, "/s", count=True)
    return [text.format(a=a_text, b=b_text, r=a.median / b.median)]


def incr_bar_lines(rows: list[Row]) -> list[str]:
    """Issue 29's bar, incr with one worker process: django.tasks with the ORM mirror off and at
    django-rtq's defaults (mirror on), against the native path (`@task`, mirror off) and huey."""
    native, huey = drain_rate(find(rows, "rtq", "incr"), 1), drain_rate(find(rows, "huey", "incr"), 1)
    plain = drain_rate(find(rows, "rtq-django", "incr"), 1)
    defaults = drain_rate(find(rows, "rtq-django-defaults", "incr"), 1)
    at_defaults = "django.tasks at the defaults (ORM mirror on)"
    return [
        *compared(plain, native, "incr, 1 process: django.tasks {a} vs @task {b} = {r:.2f}x the native path"),
        *compared(
            defaults,
            native,
            f"incr, 1 process: {at_defaults} {{a}} vs @task (mirror off) {{b}} = {{r:.2f}}x the native path",
        ),
        *compared(defaults, huey, f"incr, 1 worker process: {at_defaults} {{a}} vs huey {{b}} = {{r:.2f}}x"),
    ]


def target_lines(rows: list[Row], memories: list[list[Memory]], ctx: Context) -> list[str]:
    """The comparisons issue 12 is judged on, each on one line (where the run has both sides)."""
    lines = ["", "== issue 12's figures"]

    def both(a: Figure | None, b: Figure | None, text: str) -> None:
        lines.extend(compared(a, b, text))

    incr_dj, incr_huey = find(rows, "rtq-django", "incr"), find(rows, "huey", "incr")
    for p in (1, 2):
        both(
            drain_rate(incr_dj, p),
            drain_rate(incr_huey, p),
            f"incr, {p} worker process{'es' if p > 1 else ''}: django.tasks {{a}} vs huey {{b}} = {{r:.2f}}x",
        )
    lines += incr_bar_lines(rows)
    ideal = ctx.args.sleep_concurrency / SLEEP_SECONDS
    for name in ("rtq-django", "rtq-django-defaults", "rtq"):
        row = find(rows, name, "sleep")
        for p in (1, 2):
            both(
                drain_rate(row, p),
                Figure((ideal * p,)),
                f"sleep(0.005) at concurrency {ctx.args.sleep_concurrency}, {p} process"
                f"{'es' if p > 1 else ''}, {row.system.label if row else name}: {{a}} of the ideal"
                " {b} = {r:.1%}",
            )
    native, dj = find(rows, "rtq", "empty"), find(rows, "rtq-django", "empty")
    both(
        drain_rate(dj, 1),
        drain_rate(native, 1),
        "empty, 1 process: django.tasks {a} vs @task {b} = {r:.2f}x the native path",
    )
    both(
        drain_rate(native, 1),
        drain_rate(find(rows, "huey", "empty"), 1),
        "empty, 1 process: django-rtq @task {a} vs huey {b} = {r:.2f}x",
    )
    # Enqueueing and the start of a task do not depend on its body: each handler's row is more
    # runs of the same figure, and the median of all of them is steadier than any row's.
    huey_enqueue = pooled(rows, "huey", lambda r: r.enqueue)
    for name in RTQ_SETTINGS:
        both(
            pooled(rows, name, lambda r: r.enqueue),
            huey_enqueue,
            f"single enqueue (every handler's runs), {LABELS[name]}: {{a}} vs huey {{b}} = {{r:.2f}}x",
        )
    bulk = pooled(rows, "rtq", lambda r: r.bulk)
    if bulk is not None:
        rq = pooled(rows, "rq", lambda r: r.bulk)
        lines.append(
            f"bulk enqueue_many (every handler's runs), django-rtq:"
            f" {bulk.text(whole, '/s', count=True)} in calls of {ctx.args.enqueue_tasks:,}"
            + (f" (RQ enqueue_many {rq.text(whole, '/s', count=True)})" if rq else "")
        )
    huey_p50, huey_p99 = pooled(rows, "huey", lambda r: r.p50), pooled(rows, "huey", lambda r: r.p99)
    for name in RTQ_SETTINGS:
        p50, p99 = pooled(rows, name, lambda r: r.p50), pooled(rows, name, lambda r: r.p99)
        if p50 and p99 and huey_p50 and huey_p99:
            texts = [figure.text(ms, " ms", count=True) for figure in (p50, p99, huey_p50, huey_p99)]
            lines.append(
                f"latency at an idle worker (every handler's runs), {LABELS[name]}: p50 {texts[0]},"
                f" p99 {texts[1]} vs huey p50 {texts[2]}, p99 {texts[3]}"
                f" = {p50.median / huey_p50.median:.2f}x and {p99.median / huey_p99.median:.2f}x"
            )
    for runs in memories:
        per_task = Figure(tuple(m.used / m.tasks for m in runs))
        used = Figure(tuple(m.used / 2**20 for m in runs))
        lines.append(
            f"Redis memory per small pending task, {runs[0].system.label}:"
            f" {per_task.text(whole, ' bytes', count=True)},"
            f" used_memory +{used.text('{:,.1f}'.format, ' MiB')} for {runs[0].tasks:,} tasks"
        )
    return lines


def network_target_lines(rows: list[Row], ctx: Context) -> list[str]:
    """Issue 29's figures, across the delay proxy: its bar of django.tasks against huey, and with
    the incr body's I/O across the network too, each drain against the thread-bound ceiling
    (threads / the handler's time, one round trip through the proxy)."""
    trip = ctx.network.round_trip
    if trip is None:
        return []
    lines = ["", f"== issue 29's figures, across the delay proxy ({ms(trip.proxied)} ms a round trip)"]
    huey = find(rows, "huey", "incr")
    huey_rate = huey.drain(1, rate) if huey else None
    for name in ("rtq-django", "rtq"):
        row = find(rows, name, "incr")
        rtq_rate = row.drain(1, rate) if row else None
        if rtq_rate and huey_rate:
            lines.append(
                f"incr, 1 worker process: {LABELS[name]} {rtq_rate.text(whole, '/s', count=True)} vs huey"
                f" {huey_rate.text(whole, '/s', count=True)} = {rtq_rate.median / huey_rate.median:.2f}x"
                " (a run at --rtt 0 gives its loopback rate)"
            )
    lines += incr_bar_lines(rows)
    if ctx.network.handler != ctx.network.direct:
        for name in ("rtq-django", "rtq-django-defaults", "rtq", "huey"):
            row = find(rows, name, "incr")
            if row is None:
                continue
            ceiling = row.concurrency / trip.proxied
            for p in ctx.args.processes:
                figure = row.drain(p, rate)
                if figure is not None:
                    lines.append(
                        f"incr across the network, {p} process{'es' if p > 1 else ''}, {row.system.label}:"
                        f" {figure.text(whole, '/s', count=True)} = {figure.median / (p * ceiling):.1%} of"
                        f" the ceiling {row.concurrency * p} threads / {ms(trip.proxied)} ms ="
                        f" {p * ceiling:,.0f}/s"
                    )
    return lines


# --- the run ------------------------------------------------------------------------------


def make_driver(system: System, network: Network, prefix: str, logs: Path, cpu: int | None) -> Driver:
    """The system's driver, on the network's queue; queues are filled by one straight to Redis."""
    driver = Driver(system, system_env(system, network, prefix), logs / f"driver-{system.name}.log", cpu)
    if network.queue != network.direct:
        env = system_env(system, network, prefix, queue_url=network.direct)
        driver.filler = Driver(system, env, logs / f"filler-{system.name}.log", cpu)
    return driver


def network_lines(network: Network, args: argparse.Namespace) -> list[str]:
    trip = network.round_trip
    if trip is None:
        return ["bench: no delay proxy (--rtt 0): every client talks to redis-server over loopback"]
    handler = "through the proxy too" if network.handler != network.direct else "straight to Redis"
    where = "" if args.redis_cpu is None else f", kept on CPU {args.redis_cpu} with redis-server"
    return [
        f"bench: delay proxy (bench/delay_proxy.py, its own process{where}) in front of redis-server,"
        f" {args.rtt / 2:g} ms each way (--rtt {args.rtt:g}): every system's clients and workers go"
        f" through it; the incr body's own INCR goes {handler} (--handler-redis {args.handler_redis});"
        " filling queues, the counts and the latency stamps go straight to Redis",
        f"bench: round trip it adds: {ms(trip.added)} ms (PING p50 {ms(trip.proxied)} ms through it"
        f" vs {ms(trip.direct)} ms straight, {trip.pings} pings each)",
    ]


def run(
    args: argparse.Namespace, systems: list[System], network: Network, prefix: str, logs: Path
) -> list[str]:
    client = redis.Redis.from_url(network.direct)
    ctx = Context(args, client, network, prefix, logs)
    for system in systems:
        if system.migrate:
            migrate(system, network, prefix, logs)
    drivers = {s.name: make_driver(s, network, prefix, logs, args.driver_cpu) for s in systems}
    try:
        lines = header_lines(systems, {name: d.hello for name, d in drivers.items()}, client)
        lines += network_lines(network, args)
        lines.append(
            f"bench: key prefix {prefix}; {args.enqueue_tasks:,} enqueues, drains of {args.drain_tasks:,}"
            f" tasks (timed for at most {args.drain_seconds:g} s), {args.latency_tasks} latency tasks"
            f" {args.latency_gap * 1000:g} ms apart, {args.memory_tasks:,} tasks for memory"
        )
        lines.append(repeat_line(args.repeat))
        if args.redis_cpu is not None:
            lines.append(
                f"bench: redis-server kept on CPU {args.redis_cpu}, the enqueueing drivers on CPU"
                f" {args.driver_cpu} (a client on another core); a single worker process drains on CPU"
                f" {args.driver_cpu} too (the drivers idle meanwhile), then is unpinned for the latency;"
                " two go where the scheduler puts them"
            )
        for line in lines:
            print(line, flush=True)
        rows: list[Row] = []
        started = time.monotonic()
        for handler in args.handlers:  # every system in turn for one handler: drift spreads evenly
            for system in systems:
                row = measure_row(ctx, drivers[system.name], handler)
                rows.append(row)
                print(progress_line(row), flush=True)
        memories = [ctx.repeat(functools.partial(measure_memory, ctx, drivers[s.name])) for s in systems]
        summary: list[str] = []
        for handler in args.handlers:
            summary += handler_tables(handler, [r for r in rows if r.handler == handler], ctx)
        summary += memory_lines(memories)
        summary += [
            "",
            "* capped: timed for --drain-seconds, not to the last task.  ¹ RQ runs one job at a time per"
            " process (SimpleWorker: no fork per job); its rows are 1 and 2 such processes.",
            "bulk: django-rtq enqueue_many and RQ enqueue_many, one call of --enqueue-tasks tasks, building"
            " them included; huey, Dramatiq, Celery (for plain tasks) and django.tasks have no bulk call.",
            "RSS/PSS: the worker's whole process tree, after the drain (Dramatiq: its master too; django-rtq"
            " with 2 processes: its supervisor too). RSS counts pages a forked child shares with its parent"
            " in each; PSS divides them.",
        ]
        summary += target_lines(rows, memories, ctx)
        summary += network_target_lines(rows, ctx)
        summary.append(
            f"bench: {time.monotonic() - started:.0f} s; load average now "
            + ", ".join(f"{v:.2f}" for v in os.getloadavg())
        )
        for line in summary:
            print(line, flush=True)
        return lines + summary
    finally:
        for driver in drivers.values():
            driver.close()


def main() -> int:
    args = parse_args()
    systems = make_systems(args)
    cpus = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cpus) >= 2
    args.redis_cpu, args.driver_cpu = (cpus[0], cpus[1]) if pin else (None, None)
    prefix = f"peersbench-{uuid.uuid4().hex[:10]}"
    with (
        tempfile.TemporaryDirectory(prefix="peersbench-logs-") as logs,
        private_redis(args.redis_server, args.redis_cpu) as url,
        contextlib.ExitStack() as stack,
    ):
        network = Network(direct=url, queue=url, handler=url)
        if args.rtt > 0:
            proxy_url, proxy = stack.enter_context(delay_proxy(url, args.rtt, args.redis_cpu))
            trip = RoundTrip(ping_p50(proxy_url, RTT_PINGS), ping_p50(url, RTT_PINGS), RTT_PINGS)
            handler = proxy_url if args.handler_redis == "proxy" else url
            network = Network(url, proxy_url, handler, proxy, trip)
        # bench.peers.common names its keys after these, in every process and in this one
        os.environ.update(BENCH_REDIS_URL=url, BENCH_PREFIX=prefix)
        sys.path.insert(0, str(REPO_ROOT))
        try:
            run(args, systems, network, prefix, Path(logs))
        except Exception:
            print(f"bench: failed; the logs: {logs}", flush=True)
            for log in sorted(Path(logs).glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-15:]
                if tail:
                    print(f"--- {log.name} (last lines)\n" + "\n".join(tail), flush=True)
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

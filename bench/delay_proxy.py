"""A TCP proxy that holds back every chunk of bytes for a fixed time in each direction: a network.

    python bench/delay_proxy.py --target 127.0.0.1:6379 --delay-ms 1.0 [--listen 127.0.0.1:0]

It prints `listening <host>:<port>` once it accepts connections, then forwards every connection
to the target until it is killed. Each chunk read from one side is written to the other
`--delay-ms` after it arrived (so a round trip through it gains twice that): a delay, not a
throttle. Chunks queue in arrival order, each with its own release time, so data a client
pipelines keeps flowing while earlier chunks are held (throughput is not capped by the delay),
and every connection has its own queues on one event loop (no connection waits for another's).
An end of stream is delayed like data. This kernel has no netem: bench/peers.py --rtt runs it.

On SIGUSR1 it prints `chunks <to the target> <from the target> connections <accepted>`, counted
since it started: a client of a request-reply protocol such as Redis's sends one chunk a request
(or a pipeline of them) and waits for the reply, so the first count is its round trips.

The event loop runs on select(), not epoll: epoll's timeouts are whole milliseconds, rounded
up, which would add up to a millisecond to every delay; select's are microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import selectors
import signal
import sys
from collections import deque
from dataclasses import dataclass


@dataclass
class Counts:
    to_target: int = 0
    from_target: int = 0
    connections: int = 0

    def report(self) -> None:
        print(f"chunks {self.to_target} {self.from_target} connections {self.connections}", flush=True)


class Direction:
    """The bytes of one direction of one connection, each chunk released `delay` seconds after
    it arrived, in order. None in the queue is the end of the stream."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, counts: Counts, upstream: bool) -> None:
        self.loop = loop
        self.delay = delay
        self.counts = counts
        self.upstream = upstream
        self.pending: deque[tuple[float, bytes | None]] = deque()
        self.target: asyncio.Transport | None = None  # set once the side it writes to is connected
        self.timer: asyncio.TimerHandle | None = None

    def push(self, data: bytes | None) -> None:
        self.pending.append((self.loop.time() + self.delay, data))
        if data is not None:
            if self.upstream:
                self.counts.to_target += 1
            else:
                self.counts.from_target += 1
        self.schedule()

    def connect(self, target: asyncio.Transport) -> None:
        self.target = target
        self.schedule()

    def schedule(self) -> None:
        """One timer a direction at a time, for its oldest chunk: the order of release is the
        order of arrival (the loop's timers alone do not order equal times)."""
        if self.timer is None and self.pending and self.target is not None:
            self.timer = self.loop.call_at(self.pending[0][0], self.release)

    def release(self) -> None:
        self.timer = None
        assert self.target is not None
        now = self.loop.time()
        while self.pending and self.pending[0][0] <= now:
            _, data = self.pending.popleft()
            if data is None:
                self.pending.clear()
                self.target.close()  # after what it still buffers
                return
            if not self.target.is_closing():
                self.target.write(data)
        self.schedule()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.pending.clear()


class Side(asyncio.Protocol):
    """One end of a proxied connection: what it reads goes into `outgoing`; when the transport
    it writes to is full, the other side stops reading until it drains."""

    def __init__(self, outgoing: Direction) -> None:
        self.outgoing = outgoing
        self.transport: asyncio.Transport | None = None
        self.other: Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.outgoing.push(data)

    def eof_received(self) -> bool:
        self.outgoing.push(None)
        return True  # the transport stays open until the delayed end of stream closes it

    def connection_lost(self, exc: Exception | None) -> None:
        self.outgoing.push(None)

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class ClientSide(Side):
    """A client's connection to the proxy; it opens its own connection to the target."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, delay: float, target: tuple[str, int], counts: Counts
    ) -> None:
        super().__init__(Direction(loop, delay, counts, upstream=True))
        self.loop = loop
        self.target = target
        self.incoming = Direction(loop, delay, counts, upstream=False)
        counts.connections += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.incoming.connect(self.transport)
        self.loop.create_task(self.open_upstream())

    async def open_upstream(self) -> None:
        assert self.transport is not None
        try:
            _, upstream = await self.loop.create_connection(lambda: Side(self.incoming), *self.target)
        except OSError:
            self.outgoing.cancel()
            self.transport.close()
            return
        upstream.other, self.other = self, upstream
        assert upstream.transport is not None
        if self.transport.is_closing():  # the client left while the target was connecting
            upstream.transport.close()
            return
        self.outgoing.connect(upstream.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.other is None:  # the target is not connected yet: nothing to deliver to
            self.outgoing.cancel()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    loop = asyncio.get_running_loop()
    counts = Counts()
    loop.add_signal_handler(signal.SIGUSR1, counts.report)
    server = await loop.create_server(lambda: ClientSide(loop, delay, target, counts), *listen)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=address, required=True, help="host:port to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="delay each way, in milliseconds")
    parser.add_argument("--listen", type=address, default=("127.0.0.1", 0), help="host:port (0: any free)")
    args = parser.parse_args()
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(serve(args.listen, args.target, args.delay_ms / 1000))
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

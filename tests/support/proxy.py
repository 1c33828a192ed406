"""A TCP proxy on a loopback port that tests can cut, to make a server unreachable and back, or
slow down, to put a server a network's round trip away."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time

from tests.support.servers import free_port


class TCPProxy:
    """Forwards 127.0.0.1:<port> to a target. `down()` drops every connection and refuses new
    ones (the listener is closed); `up()` listens again on the same port. With `delay` (seconds),
    each chunk of bytes waits that long before it is passed on, in each direction: a round trip
    through the proxy takes twice as long at least."""

    def __init__(self, target_host: str, target_port: int, *, delay: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = free_port()  # the same port again after down(), so not one the kernel hands out
        self._listener: socket.socket | None = None
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._running = False

    def up(self) -> TCPProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._running = True
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def down(self) -> None:
        self._running = False
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while self._running:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in selector.select(timeout=1.0):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    if self.delay:
                        time.sleep(self.delay)
                    key.data.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            for sock in (a, b):
                sock.close()

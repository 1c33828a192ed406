"""Record a handler's start and end in a file of its process's own (not in Redis: it may be down)."""

import os
import time


def record(event: str, key: str) -> None:
    """Append `<event> <key> <pid> <time>` with one write() on an O_APPEND file: a SIGKILL after
    it returns cannot take the line back."""
    pid = os.getpid()
    path = os.path.join(os.environ["CHAOS_EVENTS"], f"{pid}.log")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event} {key} {pid} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)

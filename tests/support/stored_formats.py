"""The golden fixtures of the stored formats (tests/data/formats/): read a queue's keys."""

from __future__ import annotations

from typing import Any


def read_keys(client: Any, prefix: str) -> dict[str, dict[str, Any]]:
    """Every key whose name starts with `prefix`, with its type and what it holds."""
    keys = {}
    for key in sorted(client.scan_iter(f"{prefix}*", count=1000)):
        kind = client.type(key)
        if kind == "hash":
            value: Any = dict(sorted(client.hgetall(key).items()))
        elif kind == "zset":
            value = [[member, score] for member, score in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        else:
            value = client.get(key)
        keys[key] = {"type": kind, "value": value}
    return keys

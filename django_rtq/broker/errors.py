"""Which of redis-py's errors pass by themselves, and their translation into BrokerUnavailable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from ..exceptions import BrokerUnavailable

#: Errors Redis answers while it cannot take writes for a while (loading, a failover, out of
#: memory, no quorum of replicas): the write is retried later, as on a lost connection.
TRANSIENT_REPLIES = (
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "OOM",
    "NOREPLICAS",
    "MISCONF",
    "BUSY ",
)


@contextmanager
def translate_errors() -> Iterator[None]:
    """Turn redis-py's errors that pass by themselves (a lost connection, a failover, a server
    loading or out of memory) into BrokerUnavailable; others (a script's error) stay as they are."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError) as exc:
        raise BrokerUnavailable(f"Redis is unreachable: {exc}") from exc
    except redis.ResponseError as exc:
        if passes_by_itself(exc):
            raise BrokerUnavailable(f"Redis cannot take the command now: {exc}") from exc
        raise


def passes_by_itself(exc: Exception) -> bool:
    """Whether a redis-py error is one that `translate_errors` makes BrokerUnavailable."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.exceptions.ClusterError):
        return True
    return isinstance(exc, redis.ResponseError) and (
        str(exc).startswith(TRANSIENT_REPLIES) or isinstance(exc, redis.exceptions.ClusterDownError)
    )

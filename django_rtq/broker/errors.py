"""Which of redis-py's errors pass by themselves, and their translation into BrokerUnavailable."""

from __future__ import annotations

from typing import Any

import redis
from redis import exceptions as redis_errors

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

#: The classes redis-py's parser makes of those replies. It drops the reply's code from the
#: message (`-OOM command not allowed …` becomes OutOfMemoryError("command not allowed …")),
#: so these are known by their class; the others (and these, in the versions whose plain
#: client keeps the code: TRYAGAIN, MASTERDOWN) by their text.
TRANSIENT_ERRORS = (
    redis.ConnectionError,  # BusyLoadingError (LOADING) too
    redis.TimeoutError,
    redis_errors.ClusterError,  # ClusterDownError (CLUSTERDOWN) and MasterDownError too
    redis_errors.OutOfMemoryError,
    redis_errors.ReadOnlyError,
    redis_errors.TryAgainError,
)


class _TranslateErrors:
    """The context manager `translate_errors` returns (a class, not a generator: it wraps every
    command, and costs a fourth as much so)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, traceback: Any) -> bool:
        if not isinstance(exc, redis.RedisError) or not passes_by_itself(exc):
            return False
        if isinstance(exc, redis.ResponseError):
            raise BrokerUnavailable(f"Redis cannot take the command now: {_described(exc)}") from exc
        raise BrokerUnavailable(f"Redis is unreachable: {exc}") from exc


_TRANSLATE_ERRORS = _TranslateErrors()


def translate_errors() -> _TranslateErrors:
    """Turn redis-py's errors that pass by themselves (a lost connection, a failover, a server
    loading or out of memory) into BrokerUnavailable; others (a script's error) stay as they are."""
    return _TRANSLATE_ERRORS


def passes_by_itself(exc: Exception) -> bool:
    """Whether a redis-py error is one that `translate_errors` makes BrokerUnavailable."""
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(TRANSIENT_REPLIES)


def _described(exc: redis.ResponseError) -> str:
    """The reply as Redis sent it: its code (which redis-py keeps apart, if at all), then its text."""
    code = getattr(exc, "status_code", None)
    return f"{code} {exc}" if code and not str(exc).startswith(code) else str(exc)

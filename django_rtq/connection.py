"""The process-wide Redis client and broker, built lazily from settings."""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver

from .broker import Broker
from .conf import get_settings

_lock = threading.Lock()
_broker: Broker | None = None


def redis_client(url: str, **options: Any) -> redis.Redis:
    """Return a client for a redis:// (or rediss://, unix://) URL, decoding replies to str."""
    return redis.Redis.from_url(url, decode_responses=True, **options)


def get_broker() -> Broker:
    """Return this process's broker, creating it from settings on first use."""
    global _broker
    if _broker is None:
        with _lock:
            if _broker is None:
                conf = get_settings()
                _broker = Broker(
                    redis_client(conf.REDIS_URL),
                    prefix=conf.KEY_PREFIX,
                    counter_ttl=int(conf.STATS_TTL),
                )
    return _broker


def reset_broker() -> None:
    """Forget the broker, so the next use builds it anew (after a fork or a settings change)."""
    global _broker
    broker, _broker = _broker, None
    if broker is not None:
        broker.client.close()


@receiver(setting_changed)
def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting == "RTQ":
        reset_broker()


# A forked child must not share its parent's sockets.
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_broker", None))


def get_inspector():
    """Return an inspector over this process's broker."""
    from .broker.inspect import Inspector

    return Inspector(get_broker())

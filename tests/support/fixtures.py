"""Fixtures of the process's settings: the mirror on, Redis away, the django.tasks backend with its outbox."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from django_rtq.broker import Broker
from django_rtq.connection import get_broker, reset_broker
from tests.support.servers import free_port


@pytest.fixture
def mirroring(settings, prefix) -> None:
    """Turn the mirror on (the test settings have it off)."""
    settings.RTQ = {**settings.RTQ, "MIRROR": True}


@pytest.fixture
def redis_away(settings, prefix) -> Iterator[Callable[[], Broker]]:
    """Point the process at a loopback port where no Redis listens, with no retries and a short
    connect timeout, so that each try fails at once; call the fixture's value to bring Redis
    back: it returns the broker."""
    real = settings.RTQ
    settings.RTQ = {
        **real,
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "REDIS_OPTIONS": {"retry": None, "socket_connect_timeout": 0.5},
    }
    reset_broker()

    def back() -> Broker:
        settings.RTQ = real
        reset_broker()
        return get_broker()

    yield back
    reset_broker()


@pytest.fixture
def outbox_backend(settings) -> None:
    """The django.tasks backend with `OUTBOX` on: its enqueues wait for the transaction's commit."""
    settings.TASKS = {
        "default": {
            "BACKEND": "django_rtq.backends.RTQBackend",
            "QUEUES": ["default", "low"],
            "OPTIONS": {"OUTBOX": True},
        }
    }

"""Django settings of bench/django_tasks_worker_cost.py's floor: bench/peers/rtq_settings.py with
bench/peers/without_django_contract.py installed, which takes Django's part out of the runner."""

from bench.peers.rtq_settings import (  # noqa: F401
    DATABASES,
    DEBUG,
    DEFAULT_AUTO_FIELD,
    LOGGING,
    RTQ,
    SECRET_KEY,
    TASKS,
    USE_TZ,
)
from bench.peers.rtq_settings import INSTALLED_APPS as _INSTALLED_APPS

INSTALLED_APPS = [*_INSTALLED_APPS, "bench.peers.without_django_contract.WithoutDjangoContract"]

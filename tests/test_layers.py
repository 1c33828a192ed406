"""The layers point one way: the broker is imported and used without Django."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.support import ROOT

WITHOUT_DJANGO = textwrap.dedent(
    """
    import sys, uuid
    sys.modules["django"] = None  # any import of Django now fails
    import redis
    from django_rtq.broker import Broker, TaskMessage, TaskState
    from django_rtq.broker import bulk, manual
    from django_rtq.broker.inspect import Inspector

    broker = Broker(redis.Redis.from_url(sys.argv[1], decode_responses=True), prefix=sys.argv[2])
    message = TaskMessage(id=str(uuid.uuid4()), task="some.task", queue="default", args=[1])
    broker.enqueue([message])
    [claimed] = broker.claim("default", worker_id="w", limit=1)
    assert claimed.id == message.id and broker.complete("default", [], worker_id="w") == 0
    assert Inspector(broker).get_task(message.id).state == TaskState.ACTIVE
    pending = TaskMessage(id=str(uuid.uuid4()), task="some.task", queue="default")
    broker.enqueue([pending])
    assert manual.archive(broker, "default", [pending.id]) == 1
    job = bulk.start(broker, "default", "delete", [TaskState.ARCHIVED])
    assert bulk.carry_on(broker, "default", job.id, budget=1).done == 1
    assert not [name for name, module in sys.modules.items() if name.split(".")[0] == "django" and module]
    print("ok")
    """
)


def test_the_broker_works_without_django(redis_url, prefix):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_DJANGO, redis_url, prefix],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_public_names_are_there():
    import django_rtq

    assert django_rtq.task.__module__ == "django_rtq.registry"
    assert set(django_rtq.__all__) == set(django_rtq._EXPORTS) and set(django_rtq.__all__) <= set(
        dir(django_rtq)
    )

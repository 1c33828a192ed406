"""A worker without Redis: burst workers give up with a non-zero status, and only the
healthchecker tells of the outage (once, then reminders, then its end)."""

from __future__ import annotations

import logging

from django_rtq import exceptions
from django_rtq.worker import healthchecker
from django_rtq.worker.component import Component
from django_rtq.worker.healthchecker import Healthchecker
from django_rtq.worker.server import EXIT_REDIS_UNREACHABLE
from tests.support.polling import wait_for
from tests.support.servers import free_port


def test_a_burst_worker_gives_up_on_an_unreachable_redis_with_a_non_zero_status(start_worker):
    port = free_port()
    process = start_worker("--burst", "--give-up-after", "1", RTQ_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == EXIT_REDIS_UNREACHABLE == 3, output
    assert "gives up: Redis has been unreachable for more than 1s" in output
    # Said once, by the healthchecker, and not as "Redis is unreachable: Redis is unreachable".
    assert [line for line in output.splitlines() if line.startswith("Redis is unreachable")] == [
        f"Redis is unreachable: Error 111 connecting to 127.0.0.1:{port}. Connection refused. The worker "
        "waits for it: tasks it holds keep running, and their outcomes are written once it is back."
    ]
    assert "pass skipped" not in output and "cannot claim" not in output


def test_supervised_burst_workers_give_up_too(start_worker):
    process = start_worker(
        "--burst",
        "--processes",
        "2",
        "--give-up-after",
        "1",
        RTQ_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
    )
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 3, output
    assert output.count("gives up") == 2 and "restarting it" not in output


class Unreachable:
    """A broker whose Redis does not answer until told to."""

    def __init__(self) -> None:
        self.down = True

    def ping(self) -> bool:
        if self.down:
            raise exceptions.BrokerUnavailable(
                "Redis is unreachable: Error 111 connecting. Connection refused."
            )
        return True


def test_the_healthchecker_tells_an_outage_once_then_reminds_then_tells_its_end(caplog, monkeypatch):
    broker = Unreachable()
    checker = Healthchecker(broker=broker, interval=1)
    with caplog.at_level(logging.DEBUG, logger="django_rtq"):
        for _ in range(3):
            checker.run_once()
        assert [record.getMessage() for record in caplog.records] == [
            "Redis is unreachable: Error 111 connecting. Connection refused. The worker waits for it: "
            "tasks it holds keep running, and their outcomes are written once it is back."
        ]
        assert checker.outage_seconds() > 0
        monkeypatch.setattr(healthchecker, "OUTAGE_REMINDER_SECONDS", 0.0)
        checker.run_once()
        assert caplog.records[-1].getMessage().startswith("Redis still unreachable after ")
        broker.down = False
        checker.run_once()
        assert caplog.records[-1].getMessage().startswith("Redis is reachable again, after ")
        assert checker.outage_seconds() == 0


class SkippedByTheOutage(Component):
    name = "skipped"

    def __init__(self) -> None:
        super().__init__(interval=0.001)
        self.passes = 0

    def run_once(self) -> None:
        self.passes += 1
        raise exceptions.BrokerUnavailable("Redis is unreachable: gone")


def test_components_leave_the_outage_to_the_healthchecker(caplog):
    component = SkippedByTheOutage()
    with caplog.at_level(logging.DEBUG, logger="django_rtq"):
        component.start()
        wait_for(lambda: component.passes >= 50, message="passes of the component")
        component.stop()
    levels = {record.levelno for record in caplog.records if record.name == "django_rtq.worker.skipped"}
    assert levels == {logging.DEBUG}

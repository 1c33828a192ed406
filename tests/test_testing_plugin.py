"""The pytest plugin of the testing helpers, enabled as a project would, in a pytest run of its own."""

from __future__ import annotations

import os

from tests.support import ROOT

pytest_plugins = ["pytester"]

PROJECT_TESTS = """
from django_rtq import task


@task(queue="emails", retention=60)
def send_receipt(order_id):
    return f"receipt {order_id}"


def test_capture(rtq_capture):
    send_receipt.enqueue(42)
    rtq_capture.assert_enqueued(send_receipt, args=[42], queue="emails")


def test_capture_failing(rtq_capture):
    send_receipt.enqueue(41)
    rtq_capture.assert_enqueued(send_receipt, args=[42])


def test_eager(rtq_eager):
    send_receipt.enqueue(1)
    assert rtq_eager.results == ["receipt 1"]


def test_burst_on_fake_redis(rtq_fake_redis, rtq_worker):
    message = send_receipt.enqueue(2)
    assert rtq_worker(queues=["emails"]).results == {message.id: "receipt 2"}
    assert rtq_fake_redis.hget(message_key("state"), message.id) == "completed"


def test_burst_on_redis(rtq_worker):
    message = send_receipt.enqueue(3)
    assert rtq_worker(queues=["emails"]).results == {message.id: "receipt 3"}


def message_key(column):
    from django_rtq import get_broker

    return getattr(get_broker().queue("emails"), column)
"""


def test_the_fixtures_work_in_a_projects_tests(pytester, prefix, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings")
    pytester.makeconftest('pytest_plugins = ["django_rtq.testing.pytest_plugin"]\n')
    pytester.makepyfile(test_shop=PROJECT_TESTS)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")

    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_capture_failing*",
            "E*Error: Expected test_shop.send_receipt to be enqueued with args=[[]42[]], but it was not.",
            "E*Enqueued (1):",
            "E*- test_shop.send_receipt(args=[[]41[]], kwargs={}) queue='emails'  [[]differs: args[]]",
        ]
    )

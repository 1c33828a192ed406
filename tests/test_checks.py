"""The system checks of django_rtq/checks.py, through Django's check framework."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_rtq.checks import REDIS_TAG, TAG
from tests.support.checks import RTQ_BACKEND, ids, messages
from tests.support.servers import free_port

#: The test suite's servers run without persistence on purpose (each test starts afresh):
#: tests/test_redis_configuration_guard.py checks what that warning says.
NO_PERSISTENCE = "django_rtq.W010"


def deploy_ids() -> list[str]:
    """The ids of the deployment checks that speak, less the test servers' lack of persistence."""
    messages = run_checks(tags=[REDIS_TAG], include_deployment_checks=True)
    return sorted(m.id for m in messages if m.id != NO_PERSISTENCE)


def test_the_test_settings_pass(settings):
    assert ids() == []
    call_command("check", "--tag", TAG)


def test_invalid_rtq_settings(settings):
    settings.RTQ = {"REDIS_ULR": "redis://localhost"}
    assert ids() == ["django_rtq.E001"]
    assert "REDIS_ULR" in messages("django_rtq.E001")[0]
    with pytest.raises(SystemCheckError, match=r"django_rtq\.E001"):
        call_command("check", "--tag", TAG)


def test_bad_queue_weights_are_settings_errors(settings):
    settings.RTQ = {**settings.RTQ, "QUEUES": {"default": 0}}
    assert ids() == ["django_rtq.E001"]


@pytest.mark.parametrize(
    ("rtq", "message"),
    [
        ({"REDIS_URL": "http://localhost"}, "unknown scheme"),
        ({"REDIS_URL": "redis+sentinel://127.0.0.1:26379"}, "service name"),
        ({"REDIS_URL": "redis+cluster://127.0.0.1:7000/3"}, "database 0"),
        ({"REDIS_OPTIONS": "socket_timeout=1"}, "must be a dict"),
        ({"REDIS_OPTIONS": {"decode_responses": False}}, "decode_responses"),
    ],
)
def test_invalid_connection_settings(settings, rtq, message):
    settings.RTQ = {**settings.RTQ, **rtq}
    assert ids() == ["django_rtq.E002"]
    assert message in messages("django_rtq.E002")[0]


@pytest.mark.parametrize(
    ("caches", "message"),
    [
        ({"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}, "no such cache"),
        ({"redis": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}, "not a Redis cache"),
        ({"redis": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "localhost:6379"}}, "scheme"),
        (
            {
                "redis": {
                    "BACKEND": "django_redis.cache.RedisCache",
                    "LOCATION": "redis://mymaster/0",
                    "OPTIONS": {"CLIENT_CLASS": "django_redis.client.SentinelClient"},
                }
            },
            "SENTINELS",
        ),
    ],
)
def test_unusable_cache_alias(settings, caches, message):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}, **caches}
    settings.RTQ = {key: value for key, value in settings.RTQ.items() if key != "REDIS_URL"}
    settings.RTQ = {**settings.RTQ, "CACHE_ALIAS": "redis"}
    assert ids() == ["django_rtq.E003"]
    assert message in messages("django_rtq.E003")[0]


def test_a_usable_cache_alias_passes_but_not_beside_a_redis_url(settings, redis_url):
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}}
    settings.RTQ = {key: value for key, value in settings.RTQ.items() if key != "REDIS_URL"}
    settings.RTQ = {**settings.RTQ, "CACHE_ALIAS": "default"}
    assert ids() == []
    settings.RTQ = {**settings.RTQ, "REDIS_URL": redis_url}
    assert ids() == ["django_rtq.W002"]


def test_queues_of_django_tasks_backends(settings):
    settings.RTQ = {**settings.RTQ, "QUEUES": {"default": 2, "emails": 1}}
    settings.TASKS = {
        "default": {"BACKEND": RTQ_BACKEND, "QUEUES": ["default", "emails", "reports", "bad:name"]},
        "other": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": ["x:y"]},
        "any_queue": {"BACKEND": RTQ_BACKEND, "QUEUES": []},
        "default_queue": {"BACKEND": RTQ_BACKEND},
    }
    assert ids() == ["django_rtq.E004", "django_rtq.W001"]
    assert "'bad:name' is invalid" in messages("django_rtq.E004")[0]
    assert "'reports' is not in RTQ['QUEUES']" in messages("django_rtq.W001")[0]


def test_queues_of_a_tasks_backend_must_be_a_list(settings):
    settings.TASKS = {"default": {"BACKEND": RTQ_BACKEND, "QUEUES": "default,emails"}}
    assert ids() == ["django_rtq.E004"]


def test_redis_is_pinged_only_by_the_deployment_check(settings, redis_url):
    assert deploy_ids() == []
    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis://:hunter2@127.0.0.1:{free_port()}/0"}
    assert ids() == []  # no network I/O without --deploy
    assert deploy_ids() == ["django_rtq.W003"]
    (warning,) = [m for m in run_checks(tags=[REDIS_TAG], include_deployment_checks=True)]
    assert "unreachable" in warning.msg and "hunter2" not in warning.msg
    call_command("check", "--deploy", "--tag", REDIS_TAG)  # a warning does not fail it
    with pytest.raises(SystemCheckError, match=r"django_rtq\.W003"):
        call_command("check", "--deploy", "--tag", REDIS_TAG, "--fail-level", "WARNING")


def test_the_deployment_check_pings_sentinel_and_cluster_setups(settings, redis_cluster):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}"}
    assert deploy_ids() == []
    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+cluster://127.0.0.1:{free_port()}"}
    assert deploy_ids() == ["django_rtq.W003"]
    settings.RTQ = {**settings.RTQ, "REDIS_URL": f"redis+sentinel://127.0.0.1:{free_port()}/mymaster"}
    assert deploy_ids() == ["django_rtq.W003"]


def test_invalid_settings_are_not_pinged(settings):
    settings.RTQ = {**settings.RTQ, "REDIS_URL": "nope://"}
    assert deploy_ids() == []

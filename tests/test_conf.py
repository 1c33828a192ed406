"""Settings and retry backoff: pure logic."""

import ast
import inspect

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_rtq import defaults
from django_rtq.broker import Broker
from django_rtq.conf import RTQSettings, get_settings, parse_queues
from django_rtq.defaults import DEFAULT_REDIS_URL
from django_rtq.retry import BACKOFF_CAP_SECONDS, exponential_backoff, resolve_backoff


def test_queues_parse_from_strings_lists_and_dicts():
    assert parse_queues("critical:6,default:3, low") == {"critical": 6, "default": 3, "low": 1}
    assert parse_queues(["a", "b:2"]) == {"a": 1, "b": 2}
    assert parse_queues({"a": 4}) == {"a": 4}


@pytest.mark.parametrize(
    ("queues", "message"),
    [("a:0", "weight of at least 1"), ("a:x", "not an integer"), ("a{b}", "invalid"), ("", "At least one")],
)
def test_bad_queues_are_refused(queues, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_queues(queues)


def test_unknown_setting_keys_are_refused(settings):
    settings.RTQ = {"REDIS_ULR": "redis://x"}
    with pytest.raises(ImproperlyConfigured, match="REDIS_ULR"):
        get_settings()


def test_redis_url_defaults_to_the_environment_then_localhost(settings, monkeypatch):
    settings.RTQ = {}
    monkeypatch.setenv("RTQ_REDIS_URL", "redis://127.0.0.1:6390/2")
    get_settings.cache_clear()
    assert get_settings().REDIS_URL == "redis://127.0.0.1:6390/2"
    monkeypatch.delenv("RTQ_REDIS_URL")
    get_settings.cache_clear()
    assert get_settings().REDIS_URL == DEFAULT_REDIS_URL


def test_settings_changes_are_seen(settings):
    settings.RTQ = {"CONCURRENCY": 3}
    assert get_settings().CONCURRENCY == 3
    settings.RTQ = {"CONCURRENCY": 4}
    assert get_settings().CONCURRENCY == 4


def test_exponential_backoff_grows_with_jitter_and_is_capped():
    error = RuntimeError()
    for retried in range(5):
        delays = [exponential_backoff(retried, error) for _ in range(200)]
        assert min(delays) >= 5 * 2**retried * 0.5 and max(delays) <= 5 * 2**retried
        assert len(set(delays)) > 1
    assert exponential_backoff(40, error) <= BACKOFF_CAP_SECONDS


def test_backoff_may_be_a_number_a_callable_or_a_dotted_path():
    assert resolve_backoff(7)(3, RuntimeError()) == 7.0
    assert resolve_backoff(lambda retried, exc: retried * 2)(3, RuntimeError()) == 6
    assert resolve_backoff("django_rtq.retry.exponential_backoff") is exponential_backoff
    with pytest.raises(TypeError):
        resolve_backoff(object())


def test_every_setting_is_documented_with_its_default():
    from dataclasses import fields
    from pathlib import Path

    from django_rtq.conf import RTQSettings

    page = (Path(__file__).parent.parent / "docs" / "settings.md").read_text()
    missing = [f.name for f in fields(RTQSettings) if f"| `{f.name}` |" not in page]
    assert missing == []


def test_the_settings_and_the_broker_take_their_defaults_from_one_django_free_module():
    made = RTQSettings()
    assert made.LEASE_SECONDS == defaults.DEFAULT_LEASE_SECONDS
    assert made.STATS_TTL == defaults.DEFAULT_STATS_TTL_SECONDS
    assert made.MAX_RECOVERIES == defaults.DEFAULT_MAX_RECOVERIES
    broker = inspect.signature(Broker).parameters
    assert broker["lease_seconds"].default == made.LEASE_SECONDS
    assert broker["counter_ttl"].default == made.STATS_TTL
    tree = ast.parse(inspect.getsource(defaults))
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]

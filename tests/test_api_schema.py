"""Schemathesis over the API's served OpenAPI schema: every request it generates gets an answer
that keeps the schema's contract (all of Schemathesis's checks, a 5xx first of all).

The run is deterministic (a fixed seed), so CI is; RTQ_SCHEMATHESIS_RANDOM=1 runs it with a
random seed instead, and names the seed in the failure (RTQ_SCHEMATHESIS_SEED=<seed> replays it).
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.wsgi import get_wsgi_application
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from hypothesis import HealthCheck, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authentication import BaseAuthentication
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from tests.testapp import api_tasks, tasks

SCHEMA_URL = "/rtq/api/schema/?format=json"
AUTH = {"X-Test-Admin": "yes"}
#: Examples per operation and variant: enough to find a crash, bounded to keep the run short.
MAX_EXAMPLES = 30
#: Checks left out, with why:
#: - negative_data_rejection: it counts a query with parameters the schema does not name as
#:   invalid, and the API ignores unknown query parameters, as DRF does.
#: - positive_data_acceptance: `queue` of an enqueue is a string in the schema, but only the
#:   configured queues (and the task type's own) are accepted, which the schema cannot list.
EXCLUDED_CHECKS = [negative_data_rejection, positive_data_acceptance]
#: The seed of a CI run; RTQ_SCHEMATHESIS_SEED picks another, RTQ_SCHEMATHESIS_RANDOM=1 a random one.
FIXED_SEED = 20261123


def run_seed() -> int:
    if os.environ.get("RTQ_SCHEMATHESIS_SEED"):
        return int(os.environ["RTQ_SCHEMATHESIS_SEED"])
    if os.environ.get("RTQ_SCHEMATHESIS_RANDOM") == "1":
        return random.SystemRandom().randrange(2**32)
    return FIXED_SEED


class HeaderAuthentication(BaseAuthentication):
    """Tests only: `X-Test-Admin: yes` makes the request a superuser's (no CSRF, no password hashing)."""

    def authenticate(self, request):
        if request.headers.get("X-Test-Admin") == "yes":
            return User(username="schemathesis", is_staff=True, is_superuser=True), None
        return None


class HeaderAuthenticationScheme(OpenApiAuthenticationExtension):
    """Describes `HeaderAuthentication` in the schema (drf-spectacular warns about it otherwise)."""

    target_class = "tests.test_api_schema.HeaderAuthentication"
    name = "testAdminHeader"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "X-Test-Admin"}


@pytest.fixture
def app(prefix, settings):
    settings.ALLOWED_HOSTS = ["*"]
    settings.RTQ = {
        **settings.RTQ,
        "API_AUTHENTICATION_CLASSES": ["tests.test_api_schema.HeaderAuthentication"],
    }
    return get_wsgi_application()


def seed() -> dict[str, str]:
    """Put tasks in several states, so that fixed path parameters reach real ones."""
    pending = api_tasks.greet.enqueue("ada")
    scheduled = api_tasks.greet.using(delay=3600).enqueue("bob")
    tasks.noop.using(queue="low").enqueue()
    return {"pending": pending.id, "scheduled": scheduled.id}


def run_operation(operation, statuses: Counter, seed: int, **fixed) -> None:
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @hypothesis_seed(seed)
        @given(case=operation.as_strategy(generation_mode=mode, **fixed))
        @hypothesis_settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case):
            # Every check Schemathesis has, but those listed in EXCLUDED_CHECKS.
            response = case.call_and_validate(headers=AUTH, excluded_checks=EXCLUDED_CHECKS)
            statuses[response.status_code] += 1

        try:
            check()
        except Unsatisfiable:
            # Nothing of this operation can be made invalid (no parameters, or only free strings).
            if mode is GenerationMode.POSITIVE:
                raise


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(110)
def test_every_request_keeps_the_contract(app):
    ids = seed()
    run = run_seed()
    schema = schemathesis.openapi.from_wsgi(SCHEMA_URL, app, headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 20
    known = {"task_id": ids["scheduled"], "queue": "default", "name": "tests.testapp.api_tasks.anything"}
    failures = []
    statuses: Counter = Counter()
    for operation in operations:
        fixed = {name: value for name, value in known.items() if f"{{{name}}}" in operation.path}
        variants = [{}, {"path_parameters": fixed}] if fixed else [{}]
        for variant in variants:
            try:
                run_operation(operation, statuses, run, **variant)
            except Exception as exc:  # collect them all, then fail once
                failures.append(f"{operation.label} {variant}: {exc}")
    assert not failures, f"seed {run} (RTQ_SCHEMATHESIS_SEED={run} replays it):\n\n" + "\n\n".join(failures)
    assert {200, 201, 202, 400, 404} <= set(statuses), statuses  # it got past validation, and was refused

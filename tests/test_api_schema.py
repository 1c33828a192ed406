"""Schemathesis over the API's served OpenAPI schema: no request it generates may get a 5xx."""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.wsgi import get_wsgi_application
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authentication import BaseAuthentication
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from tests.testapp import api_tasks, tasks

SCHEMA_URL = "/rtq/api/schema/?format=json"
AUTH = {"X-Test-Admin": "yes"}
#: Examples per operation and variant: enough to find a crash, bounded to keep the run short.
MAX_EXAMPLES = 30


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


def run_operation(operation, statuses: Counter, **fixed) -> None:
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @given(case=operation.as_strategy(generation_mode=mode, **fixed))
        @hypothesis_settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case):
            response = case.call_and_validate(headers=AUTH, checks=[not_a_server_error])
            statuses[response.status_code] += 1

        try:
            check()
        except Unsatisfiable:
            # Nothing of this operation can be made invalid (no parameters, or only free strings).
            if mode is GenerationMode.POSITIVE:
                raise


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(110)
def test_no_request_gets_a_server_error(app):
    ids = seed()
    schema = schemathesis.openapi.from_wsgi(SCHEMA_URL, app, headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 14
    known = {"task_id": ids["scheduled"], "queue": "default", "name": "tests.testapp.api_tasks.anything"}
    failures = []
    statuses: Counter = Counter()
    for operation in operations:
        fixed = {name: value for name, value in known.items() if f"{{{name}}}" in operation.path}
        variants = [{}, {"path_parameters": fixed}] if fixed else [{}]
        for variant in variants:
            try:
                run_operation(operation, statuses, **variant)
            except Exception as exc:  # collect them all, then fail once
                failures.append(f"{operation.label} {variant}: {exc}")
    assert not failures, "\n\n".join(failures)
    assert {200, 201, 400, 404} <= set(statuses), statuses  # it got past validation, and was refused

"""A project that has not run `migrate`: django-rtq's migrations unapplied on the real test
database (SQLite, or PostgreSQL in CI), and what each surface says then: W008 from `check
--database` and `check --deploy` (not plain `check`, nor `migrate` itself), an error naming
`migrate` from `enqueue_on_commit()`, and the worker's relay and mirrorer saying it once."""

from __future__ import annotations

import io
import logging

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from django_rtq.checks import check_tables, check_tables_deployed
from django_rtq.models import FinishedTask, OutboxTask
from django_rtq.worker.mirrorer import Mirrorer
from django_rtq.worker.relay import Relay
from tests.support.factories import WORKER, claim_ids, done, message
from tests.testapp import tasks

HINT = "run `manage.py migrate`"


@pytest.fixture
def unmigrated(transactional_db):
    """django-rtq's migrations unapplied (its tables gone), then applied again."""
    call_command("migrate", "django_rtq", "zero", verbosity=0)
    yield
    call_command("migrate", "django_rtq", verbosity=0)


@pytest.fixture
def rtq_settings(settings, prefix):
    """The outbox and the mirror on (set before the test's broker is built)."""
    settings.RTQ = {**settings.RTQ, "OUTBOX": True, "MIRROR": True}
    return settings


def tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def w008(messages: list[checks.CheckMessage]) -> list[checks.CheckMessage]:
    return [message for message in messages if message.id == "django_rtq.W008"]


def test_check_with_the_database_or_deploy_names_the_missing_tables_and_migrate(unmigrated, rtq_settings):
    assert OutboxTask._meta.db_table not in tables()

    for found in (check_tables(databases=["default"]), check_tables_deployed()):
        [warning] = found
        assert isinstance(warning, checks.Warning)
        assert "'django_rtq_outboxtask', 'django_rtq_finishedtask'" in warning.msg
        assert warning.hint.startswith("Run `manage.py migrate`")
    output = io.StringIO()
    call_command("check", deploy=True, tags=["django_rtq"], stdout=output, stderr=output)
    assert "django_rtq.W008" in output.getvalue()


def test_plain_check_stays_off_the_database(unmigrated, rtq_settings):
    assert w008(checks.run_checks()) == []
    assert check_tables(databases=None) == []


def test_the_checks_are_quiet_once_migrated(transactional_db, rtq_settings):
    assert check_tables(databases=["default"]) == [] and check_tables_deployed() == []


def test_migrate_on_a_fresh_database_does_not_tell_to_run_migrate(unmigrated, rtq_settings):
    output = io.StringIO()
    call_command("migrate", "django_rtq", skip_checks=False, stdout=output, stderr=output)

    assert "W008" not in output.getvalue()
    assert {OutboxTask._meta.db_table, FinishedTask._meta.db_table} <= tables()


def test_enqueue_on_commit_in_a_transaction_raises_a_database_error_naming_migrate(unmigrated, rtq_settings):
    with (
        pytest.raises(DatabaseError, match=r"django_rtq_outboxtask.*run `manage.py migrate`"),
        transaction.atomic(),
    ):
        tasks.add.enqueue_on_commit(1, 2)


def test_the_relay_says_run_migrate_once(unmigrated, rtq_settings, broker, caplog):
    caplog.set_level(logging.WARNING, "django_rtq.worker.relay")
    relay = Relay(broker=broker, interval=1.0)

    assert [relay.run_once(), relay.run_once()] == [0, 0]

    [record] = [r for r in caplog.records if r.name == "django_rtq.worker.relay"]
    assert record.levelno == logging.ERROR
    assert "'django_rtq_outboxtask' is missing from the database 'default'" in record.getMessage()
    assert HINT in record.getMessage()


def test_the_mirrorer_says_run_migrate_once(unmigrated, rtq_settings, broker, caplog):
    broker.enqueue([message("default")])
    broker.complete("default", [done(task_id) for task_id in claim_ids(broker, "default")], worker_id=WORKER)
    caplog.set_level(logging.WARNING, "django_rtq.worker.mirror")
    mirrorer = Mirrorer(broker=broker, worker_id="w", queues=["default"], interval=1.0, batch_size=10)

    assert [mirrorer.run_once(), mirrorer.run_once()] == [0, 0]

    [record] = [r for r in caplog.records if r.name == "django_rtq.worker.mirror"]
    assert record.levelno == logging.ERROR
    assert "'django_rtq_finishedtask' is missing" in record.getMessage() and HINT in record.getMessage()

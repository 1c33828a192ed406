"""Telling from a database's error that a table of django-rtq is missing: `migrate` has not run."""

from __future__ import annotations

from django.apps import apps

#: How the databases Django supports say that a table (or a column) does not exist: SQLite
#: ("no such table: t"), PostgreSQL ('relation "t" does not exist'), MySQL and MariaDB
#: ("Table 'db.t' doesn't exist"), a column a later migration adds ("no such column"), and
#: django_rtq.mirror's own MirrorTableMissing ("is missing").
MISSING_WORDS = (
    "no such table",
    "no such column",
    "does not exist",
    "doesn't exist",
    "unknown column",
    "is missing",
)


def missing_table(error: BaseException) -> str | None:
    """The table of django-rtq that `error` (a DatabaseError) says is missing or lacks a
    column, or None. Read from the error's text, not by asking the database: in PostgreSQL the
    failed statement has aborted the caller's transaction, so no other query can run in it."""
    text = str(error).lower()
    if not any(words in text for words in MISSING_WORDS):
        return None
    models = apps.get_app_config("django_rtq").get_models()
    tables = sorted((model._meta.db_table for model in models if model._meta.managed), key=len)
    for table in reversed(tables):  # the longest first: one table's name may begin another's
        if table.lower() in text:
            return table
    return None


def migrate_hint(table: str, using: str) -> str:
    """What to do about a missing table of django-rtq."""
    option = "" if using == "default" else f" --database {using}"
    return (
        f"django-rtq's table {table!r} is missing from the database {using!r}, or is older than "
        f"this release: run `manage.py migrate{option}`"
    )

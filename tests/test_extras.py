"""A part of django-rtq whose extra is not installed says which extra to install."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def import_without(hidden: str, module: str) -> subprocess.CompletedProcess:
    """Import `module` in a fresh interpreter where `hidden` cannot be imported (as if not installed)."""
    code = f"import sys; sys.modules[{hidden!r}] = None; import {module}"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("hidden", "module", "extra"),
    [
        ("drf_spectacular", "django_rtq.api.urls", "api"),
        ("rest_framework", "django_rtq.api", "api"),
        ("prometheus_client", "django_rtq.metrics.urls", "metrics"),
        ("rest_framework", "django_rtq.metrics", "metrics"),
    ],
)
def test_a_missing_extra_names_the_pip_command(hidden, module, extra):
    done = import_without(hidden, module)
    assert done.returncode == 1
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ModuleNotFoundError: django_rtq."), last_line
    assert f"needs the {hidden!r} package, which is not installed" in last_line
    assert last_line.endswith(f'pip install "django-rtq[{extra}]"'), last_line


def test_the_extras_named_are_those_of_pyproject():
    from django_rtq.extras import EXTRA_MODULES

    with (ROOT / "pyproject.toml").open("rb") as file:
        extras = tomllib.load(file)["project"]["optional-dependencies"]
    for extra, modules in EXTRA_MODULES.items():
        packages = " ".join(extras[extra]).replace("-", "_")
        assert all(module.split("_")[0] in packages for module in modules), (extra, extras[extra])


def test_with_the_extras_installed_the_parts_import():
    done = subprocess.run(
        [sys.executable, "-c", "import django_rtq.api, django_rtq.metrics"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_backend_without_django_tasks_nor_the_backport_names_the_extra():
    """Django 5.2 without `django-tasks` (on Django 6 too, django.tasks hidden the same way)."""
    code = (
        "import sys; sys.modules['django.tasks'] = None; sys.modules['django_tasks'] = None; "
        "import django; django.setup(); import django_rtq.backends"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line == (
        "ModuleNotFoundError: django_rtq.backends (the django.tasks backend, on Django 5.2) needs the "
        "'django_tasks' package, which is not installed: pip install \"django-rtq[tasks-backport]\""
    ), done.stderr

"""Where task types are found (django_rtq/discovery.py), in a small project of its own whose every
step is a process: a task outside `tasks.py`, a task module listed in settings, and a task module
that fails to import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from django_rtq.broker import TaskState

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = """
import os

SECRET_KEY = "discovery"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_rtq", {apps}]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["SITE_DATABASE"]}}}}
RTQ = {{
    "REDIS_URL": os.environ["RTQ_REDIS_URL"],
    "KEY_PREFIX": os.environ["RTQ_TEST_PREFIX"],
    "MIRROR": False,
    "RETENTION": 60,
    "TASK_MODULES": {task_modules},
}}
"""

# A task type in a module that is not `tasks`, found by its dotted path; and one named otherwise,
# found because its module is in TASK_MODULES.
JOBS = """
from django_rtq import task


@task
def stamp(name):
    return name


@task(name="kiosk-renamed")
def renamed(name):
    return name
"""

BROKEN = """
from django_rtq import task


@task
def never(name):
    return name


undefined_name  # the error a user makes
"""


@pytest.fixture
def site(tmp_path, prefix, redis_url):
    """Write a project (settings, apps) into tmp_path; return a function running python in it."""

    def make(
        *,
        apps: dict[str, dict[str, str]],
        task_modules: list[str] | None = None,
        installed: list[str] | None = None,
    ):
        for app, modules in apps.items():
            package = tmp_path / app
            package.mkdir()
            (package / "__init__.py").write_text("")
            for name, source in modules.items():
                (package / f"{name}.py").write_text(textwrap.dedent(source))
        (tmp_path / "site_settings.py").write_text(
            SETTINGS.format(
                apps=", ".join(map(repr, apps if installed is None else installed)),
                task_modules=repr(task_modules or []),
            )
        )
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "site_settings",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
            "SITE_DATABASE": str(tmp_path / "site.sqlite3"),
            "RTQ_REDIS_URL": redis_url,
            "RTQ_TEST_PREFIX": prefix,
        }

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
            )

        return run

    return make


def enqueue(run, *calls: str) -> list[str]:
    """Enqueue in a process of the site: each call an expression giving a message; return the ids."""
    script = "import django; django.setup()\n" + "\n".join(f"print(({call}).id)" for call in calls)
    done = run("-c", script)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def states(inspector, ids: list[str]) -> list[str]:
    return [str(inspector.get_task(task_id).state) for task_id in ids]


def test_a_task_outside_tasks_py_runs_from_its_first_task_on(site, inspector):
    run = site(apps={"kiosk": {"jobs": JOBS}})
    ids = enqueue(run, *[f"__import__('kiosk.jobs').jobs.stamp.enqueue('{i}')" for i in range(3)])
    worker = run("-m", "django", "rtq_worker", "--burst", "--loglevel", "WARNING")
    assert worker.returncode == 0, worker.stderr
    assert states(inspector, ids) == [TaskState.COMPLETED] * 3
    assert [inspector.get_task(task_id).result for task_id in ids] == ["0", "1", "2"]


def test_a_task_named_otherwise_runs_when_its_module_is_in_task_modules(site, inspector):
    run = site(apps={"kiosk": {"jobs": JOBS}}, task_modules=["kiosk.jobs"])
    [task_id] = enqueue(run, "__import__('kiosk.jobs').jobs.renamed.enqueue('x')")
    worker = run("-m", "django", "rtq_worker", "--burst", "--loglevel", "WARNING")
    assert worker.returncode == 0, worker.stderr
    assert states(inspector, [task_id]) == [TaskState.COMPLETED]


def test_a_task_module_that_fails_to_import_leaves_other_commands_working(site):
    run = site(apps={"kiosk": {"tasks": BROKEN}})
    migrate = run("-m", "django", "migrate", "--verbosity", "0")
    assert migrate.returncode == 0, migrate.stderr
    assert (
        "the task module 'kiosk.tasks' could not be imported: NameError: name 'undefined_name' is not defined"
        in migrate.stderr
    )

    check = run("-m", "django", "check")
    assert check.returncode == 0  # a warning: `migrate`, which runs the checks, must work
    assert "kiosk.tasks: (django_rtq.W006) The task module 'kiosk.tasks' could not be imported" in (
        check.stderr
    )
    assert 'kiosk/tasks.py", line 10, in <module>' in check.stderr  # its traceback, to the line

    worker = run("-m", "django", "rtq_worker", "--burst")
    assert worker.returncode == 1  # it refuses to start rather than archive the module's tasks
    assert "The worker does not start: it would archive the tasks of these task modules" in worker.stderr
    assert "kiosk.tasks:\nTraceback (most recent call last):" in worker.stderr


# Task types no rule finds: the check W014 and a warning at their first enqueue

BILLING_TASKS = """
from django_rtq import task


@task
def charge(number):
    return number
"""


def enqueue_and_check(module: str, function: str) -> str:
    """A script: set up Django, import `module` (as a view of the web process would), enqueue
    `function` of it, run the checks."""
    return (
        "import django, importlib; django.setup()\n"
        f"importlib.import_module({module!r}).{function}.enqueue('7')\n"
        "from django.core.management import call_command; call_command('check')\n"
    )


def test_a_task_of_an_app_not_installed_is_named_by_check_and_at_enqueue(site):
    run = site(apps={"billing": {"apps": "", "models": "", "tasks": BILLING_TASKS}}, installed=[])
    done = run("-c", enqueue_and_check("billing.tasks", "charge"))
    assert done.returncode == 0, done.stderr
    why = (
        "The task type 'billing.tasks.charge' may never run: its module 'billing.tasks' is in the app "
        "'billing', which is not in INSTALLED_APPS"
    )
    assert f"billing.tasks.charge: (django_rtq.W014) {why}" in done.stderr  # manage.py check
    assert done.stderr.count(why) == 2  # and, first, a warning at the enqueue
    assert "HINT: Add its app to INSTALLED_APPS, or define it in the app's tasks module" in done.stderr


def test_a_task_named_otherwise_outside_the_startup_modules_is_named_by_check(site):
    run = site(apps={"kiosk": {"jobs": JOBS}})
    done = run("-c", enqueue_and_check("kiosk.jobs", "renamed"))
    assert done.returncode == 0, done.stderr
    assert (
        "kiosk-renamed: (django_rtq.W014) The task type 'kiosk-renamed' may never run: it has a name of "
        "its own (name=) and its module 'kiosk.jobs' is not one the workers import at start-up"
    ) in done.stderr
    assert "kiosk.jobs.stamp" not in done.stderr  # found by its path: no warning


def test_a_task_named_otherwise_in_task_modules_gets_no_warning(site):
    run = site(apps={"kiosk": {"jobs": JOBS}}, task_modules=["kiosk.jobs"])
    done = run("-c", enqueue_and_check("kiosk.jobs", "renamed"))
    assert done.returncode == 0, done.stderr
    assert "W014" not in done.stderr and "may never run" not in done.stderr

"""Where task types come from: one rule, followed alike by web processes, commands and workers.

1. At start-up (`AppConfig.ready()`), the `tasks` module of every installed app is imported,
   then each module named in `RTQ["TASK_MODULES"]`.
2. A worker given a task whose type it does not know imports the type by its name, which is
   the function's dotted path (`@task` names a task `<module>.<qualname>`): a task defined in any
   importable module runs, unless `@task(name=...)` gave it another name; then its module must be
   found by rule 1.

A type that neither rule finds is named by `manage.py check` (`django_rtq.W014`): one with
`name=` in a module rule 1 does not import (found by a worker only if something imported its
module first), and one in an app missing from `INSTALLED_APPS` (its tasks would wait pending,
no worker able to import them). `@task` refuses a lambda or a nested function without `name=`
(registry.py): no worker could import it by its name.

A module that fails to import does not stop Django from starting (`migrate` and the other
commands work): the error is logged, `manage.py check` reports it as `django_rtq.W006`, and
`rtq_worker` refuses to start until it is fixed (its tasks would be archived as unknown).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from contextlib import suppress
from importlib import import_module
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from .conf import get_settings

logger = logging.getLogger("django_rtq")

#: Task modules that could not be imported at start-up: name -> the error, formatted.
failed_modules: dict[str, str] = {}


def discover_task_modules() -> None:
    """Import the task modules of rule 1, noting (not raising) the errors of those that fail."""
    failed_modules.clear()
    names = [
        f"{app_config.name}.tasks"
        for app_config in apps.get_app_configs()
        if module_has_submodule(app_config.module, "tasks")
    ]
    with suppress(ImproperlyConfigured):  # django_rtq.E001 says what is wrong with settings.RTQ
        names += [name for name in get_settings().TASK_MODULES if name not in names]
    for name in names:
        try:
            import_module(name)
        except Exception as exc:
            failed_modules[name] = "".join(traceback.format_exception(exc)).rstrip()
            logger.error("the task module %r could not be imported: %s: %s", name, type(exc).__name__, exc)


def startup_modules() -> set[str]:
    """The modules of rule 1: the `tasks` module of each installed app and `RTQ["TASK_MODULES"]`."""
    names = {f"{app_config.name}.tasks" for app_config in apps.get_app_configs()}
    with suppress(ImproperlyConfigured):
        names.update(get_settings().TASK_MODULES)
    return names


def why_unfound(name: str, func: Callable[..., Any], found_at_startup: set[str] | None = None) -> str | None:
    """Why a worker might not find the task type `name` of `func` by the rules above; None if it will."""
    module = getattr(func, "__module__", None)
    if not isinstance(module, str) or not apps.ready or _within(module, {"django_rtq"}):
        return None  # django-rtq's own types (workflows.iterate) are its workers' to find
    if _within(module, startup_modules() if found_at_startup is None else found_at_startup):
        return None
    if apps.get_containing_app_config(module) is None:
        package = module.rpartition(".")[0]
        if package and _is_app_package(package):
            return _NOT_INSTALLED.format(module=module, app=package)
    elif name != f"{module}.{func.__qualname__}":
        return _NAMED_ELSEWHERE.format(module=module)
    return None


#: Task types already looked at by `warn_if_unfound`, by name.
_looked_at: set[str] = set()


def warn_if_unfound(name: str, func: Callable[..., Any]) -> None:
    """Log a warning, at the first enqueue of a type in this process, if a worker might not find it
    (the check W014 says the same of the types registered when `manage.py check` runs)."""
    if name in _looked_at or not apps.ready:
        return
    _looked_at.add(name)
    why = why_unfound(name, func)
    if why:
        logger.warning("The task type %r may never run: %s. %s", name, why, UNFOUND_HINT)


UNFOUND_HINT = (
    "Add its app to INSTALLED_APPS, or define it in the app's tasks module, or add its module to "
    'RTQ["TASK_MODULES"].'
)


_NOT_INSTALLED = (
    "its module {module!r} is in the app {app!r}, which is not in INSTALLED_APPS: the workers do not "
    "import it at start-up, and the tasks of a type they cannot import wait pending"
)
_NAMED_ELSEWHERE = (
    "it has a name of its own (name=) and its module {module!r} is not one the workers import at "
    "start-up: a worker finds it only if something imported that module first"
)


def _within(module: str, modules: set[str]) -> bool:
    """Whether `module` is one of `modules` or inside one of them (a `tasks` package's submodule)."""
    return any(module == name or module.startswith(f"{name}.") for name in modules)


def _is_app_package(package: str) -> bool:
    """Whether `package` looks like a Django app (it has an `apps` or a `models` module)."""
    try:
        module = import_module(package)
    except ImportError:
        return False
    if not hasattr(module, "__path__"):
        return False
    return any(module_has_submodule(module, name) for name in ("apps", "models"))

"""Where task types come from: one rule, followed alike by web processes, commands and workers.

1. At start-up (`AppConfig.ready()`), the `tasks` module of every installed app is imported,
   then each module named in `RTQ["TASK_MODULES"]`.
2. A worker given a task whose type it does not know imports the type by its name, which is
   the function's dotted path (`@task` names a task `<module>.<qualname>`): a task defined in any
   importable module runs, unless `@task(name=...)` gave it another name; then its module must be
   found by rule 1.

A module that fails to import does not stop Django from starting (`migrate` and the other
commands work): the error is logged, `manage.py check` reports it as `django_rtq.W006`, and
`rtq_worker` refuses to start until it is fixed (its tasks would be archived as unknown).
"""

from __future__ import annotations

import logging
import traceback
from contextlib import suppress
from importlib import import_module

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

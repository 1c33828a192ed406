"""Which Django project a worker serves: a fingerprint in its info, to tell projects sharing a Redis.

Two projects left at the default settings share one Redis database and one key prefix, so
each sees the other's queues. A worker's info (`rtq:worker:<id>`) carries its project's
fingerprint and settings module; a worker and `manage.py check --deploy` warn of workers of
another project.

The fingerprint is what stays the same from one release of a project to the next and differs
between projects: an HMAC of the settings module keyed by SECRET_KEY, cut to 12 hex digits.
Neither the key nor anything it could be found from is stored. What changes between releases
(installed apps, task types, the version) is left out of it. A project rotating its
SECRET_KEY keeps the old one in SECRET_KEY_FALLBACKS for a while: the fingerprints under those
keys are stored too, and two workers sharing any fingerprint are of one project.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import ENVIRONMENT_VARIABLE, settings
from django.utils.crypto import salted_hmac

#: The HMAC's salt: a fingerprint for this use only.
FINGERPRINT_SALT = "django_rtq.projects.fingerprint"
#: Hex digits a fingerprint keeps: enough to tell projects apart, too few to test keys against.
FINGERPRINT_LENGTH = 12
#: Workers of another project a message names, at most (then "and N more").
WORKERS_NAMED = 3


@dataclass(frozen=True, slots=True)
class Project:
    """A Django project as its workers' info shows it."""

    settings_module: str
    fingerprint: str
    fallbacks: tuple[str, ...] = ()  # fingerprints under SECRET_KEY_FALLBACKS

    def info(self) -> dict[str, Any]:
        """The fields a worker adds to its info."""
        fields: dict[str, Any] = {"project": self.fingerprint, "settings": self.settings_module}
        if self.fallbacks:
            fields["project_fallbacks"] = list(self.fallbacks)
        return fields

    def runs(self, info: Mapping[str, Any]) -> bool | None:
        """Whether a worker's info is of this project; None if it does not say (a worker of
        0.1.0, or info of another shape)."""
        theirs = info.get("project")
        if not isinstance(theirs, str):
            return None
        fallbacks = info.get("project_fallbacks")
        if isinstance(fallbacks, list):
            theirs_all = {theirs, *(f for f in fallbacks if isinstance(f, str))}
        else:
            theirs_all = {theirs}
        return not theirs_all.isdisjoint({self.fingerprint, *self.fallbacks})


def fingerprint(settings_module: str, secret: str | bytes) -> str:
    return salted_hmac(FINGERPRINT_SALT, settings_module, secret, algorithm="sha256").hexdigest()[
        :FINGERPRINT_LENGTH
    ]


def current_project() -> Project:
    """This process's project, from its settings."""
    # Under override_settings SETTINGS_MODULE reads None; "" when settings.configure() set them up.
    module = settings.SETTINGS_MODULE or os.environ.get(ENVIRONMENT_VARIABLE) or ""
    fallbacks = getattr(settings, "SECRET_KEY_FALLBACKS", None) or ()
    return Project(
        settings_module=module,
        fingerprint=fingerprint(module, settings.SECRET_KEY),
        fallbacks=tuple(fingerprint(module, key) for key in fallbacks),
    )


WorkerInfo = Mapping[str, Any]


def other_projects(project: Project, workers: Iterable[WorkerInfo]) -> dict[str, list[WorkerInfo]]:
    """The workers of other projects among `workers`, by their project's fingerprint."""
    others: dict[str, list[WorkerInfo]] = {}
    for info in workers:
        if project.runs(info) is False:
            others.setdefault(info["project"], []).append(info)
    return others


def sharing_problem(workers: list[WorkerInfo], key_prefix: str) -> str:
    """What is wrong when the workers of another project share this project's Redis and prefix."""
    settings_module = workers[0].get("settings") or "(settings configured by hand)"
    named = ", ".join(f"{info.get('host')} pid {info.get('pid')}" for info in workers[:WORKERS_NAMED])
    if len(workers) > WORKERS_NAMED:
        named += f" and {len(workers) - WORKERS_NAMED} more"
    return (
        f"Workers of another Django project (settings {settings_module!r}: {named}) use this "
        f"Redis database and key prefix {key_prefix!r}. The two projects' tasks are kept apart "
        "(a worker leaves a task of a type it does not have for a worker that has it), except "
        "task types both projects define under the same name, but the queues, their stats, "
        "periodic schedules of the same name and the admin are shared."
    )


SHARING_HINT = (
    "Give each project a key prefix of its own (RTQ['KEY_PREFIX'] = 'myproject') or a Redis "
    "database of its own (RTQ['REDIS_URL'] = 'redis://host:6379/1'): see docs/deploying.md."
)

"""The optional parts of django-rtq and the extra that installs each: a clear error when one is missing."""

from __future__ import annotations

from importlib import import_module

#: The extras of pyproject.toml that a part of django-rtq needs, with the modules it imports.
EXTRA_MODULES = {
    "api": ("rest_framework", "drf_spectacular"),
    "metrics": ("prometheus_client", "rest_framework"),
    "tasks-backport": ("django_tasks",),
}


def require_extra(extra: str, part: str) -> None:
    """Import the modules `extra` installs, or raise a ModuleNotFoundError naming the pip command
    (rather than a bare "No module named 'drf_spectacular'")."""
    for module in EXTRA_MODULES[extra]:
        try:
            import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # the module is there and fails on an import of its own
                raise
            raise ModuleNotFoundError(
                f"{part} needs the {module!r} package, which is not installed: "
                f'pip install "django-rtq[{extra}]"',
                name=module,
            ) from exc

"""Who may use the API: the classes named by `RTQ["API_AUTHENTICATION_CLASSES"]` and the like."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from rest_framework.permissions import IsAdminUser
from rest_framework.settings import api_settings

from ..conf import get_settings


def authentication_classes() -> list[type]:
    """The configured authentication classes; DRF's `DEFAULT_AUTHENTICATION_CLASSES` when None."""
    paths = get_settings().API_AUTHENTICATION_CLASSES
    if paths is None:
        return list(api_settings.DEFAULT_AUTHENTICATION_CLASSES)
    return _classes(paths, "API_AUTHENTICATION_CLASSES")


def permission_classes() -> list[type]:
    """The configured permission classes; admin users only (`IsAdminUser`) when None."""
    paths = get_settings().API_PERMISSION_CLASSES
    if paths is None:
        return [IsAdminUser]
    return _classes(paths, "API_PERMISSION_CLASSES")


def _classes(paths: Any, setting: str) -> list[type]:
    if isinstance(paths, str) or not isinstance(paths, list | tuple):
        raise ImproperlyConfigured(f"RTQ[{setting!r}] must be a list of dotted paths, not {paths!r}.")
    classes = []
    for path in paths:
        if not isinstance(path, str):
            classes.append(path)  # a class given directly
            continue
        try:
            classes.append(import_string(path))
        except ImportError as exc:
            raise ImproperlyConfigured(f"RTQ[{setting!r}]: cannot import {path!r}: {exc}") from None
    return classes


class ConfiguredAccessMixin:
    """Make a view authenticate and authorize with the classes the RTQ settings name, read per request."""

    def get_authenticators(self) -> list[Any]:
        return [cls() for cls in authentication_classes()]

    def get_permissions(self) -> list[Any]:
        return [cls() for cls in permission_classes()]

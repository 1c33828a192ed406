"""Who may use the API: `RTQPermissions` by default, or the classes the RTQ settings name."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.settings import api_settings

from ..conf import get_settings
from ..permissions import has_permission


def authentication_classes() -> list[type]:
    """The configured authentication classes; DRF's `DEFAULT_AUTHENTICATION_CLASSES` when None."""
    paths = get_settings().API_AUTHENTICATION_CLASSES
    if paths is None:
        return list(api_settings.DEFAULT_AUTHENTICATION_CLASSES)
    return _classes(paths, "API_AUTHENTICATION_CLASSES")


def permission_classes() -> list[type]:
    """The configured permission classes; `RTQPermissions` when None."""
    paths = get_settings().API_PERMISSION_CLASSES
    if paths is None:
        return [RTQPermissions]
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


class RTQPermissions(BasePermission):
    """Allow an authenticated user who has the permission the view names.

    Each view declares `required_permission`: a permission name (`django_rtq.permissions`), or
    a tuple of names any one of which will do. A view that declares none is closed to all.
    Permissions that include the required one count (`change_livetask` includes
    `view_livetask`), and superusers have them all; staff status alone grants nothing.

    Objects: a view whose `object_permission(obj)` names a permission needs it for that object
    as well (`check_object_permissions`), e.g. a finished task found by the task view.
    """

    message = "You do not have permission to perform this action."

    def has_permission(self, request: Request, view: Any) -> bool:
        return self._allowed(request, getattr(view, "required_permission", None))

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        object_permission = getattr(view, "object_permission", None)
        required = object_permission(obj) if object_permission is not None else None
        return required is None or self._allowed(request, required)

    def _allowed(self, request: Request, required: str | tuple[str, ...] | None) -> bool:
        user = request.user
        if not (user and user.is_authenticated) or not required:
            return False  # anonymous: DRF answers 401 or 403 (not authenticated)
        names = (required,) if isinstance(required, str) else tuple(required)
        if any(has_permission(user, name) for name in names):
            return True
        self.message = f"You do not have permission to perform this action: it needs {' or '.join(names)}."
        return False


class ConfiguredAccessMixin:
    """Make a view authenticate and authorize with the classes the RTQ settings name, read per request."""

    def get_authenticators(self) -> list[Any]:
        return [cls() for cls in authentication_classes()]

    def get_permissions(self) -> list[Any]:
        return [cls() for cls in permission_classes()]

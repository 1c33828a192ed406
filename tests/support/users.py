"""Users holding given permissions of django_rtq, and test clients logged in as them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from rest_framework.test import APIClient


def user_with(*permissions: str, username: str | None = None, **fields: Any) -> User:
    """A staff user (password "pw") holding these permissions of django_rtq, named by codename
    ("view_livetask") or in full ("django_rtq.view_livetask"); read back, so that no
    permission is cached."""
    codenames = [permission.removeprefix("django_rtq.") for permission in permissions]
    fields.setdefault("is_staff", True)
    user = User.objects.create_user(username or "-".join(["staff", *codenames]), password="pw", **fields)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_rtq", codename__in=codenames)
    )
    return User.objects.get(pk=user.pk)


def logged_in(user: User, **options: Any) -> Client:
    client = Client(**options)
    client.force_login(user)
    return client


@pytest.fixture
def superuser_client(broker) -> Client:
    return logged_in(User.objects.create_superuser("admin", "admin@example.com", "pw"))


@pytest.fixture
def viewer_client(broker) -> Client:
    return logged_in(user_with("view_livetask", username="viewer"))


@pytest.fixture
def outsider_client(broker) -> Client:
    """Staff who may read history but not live tasks."""
    return logged_in(user_with("view_finishedtask", username="outsider"))


@pytest.fixture
def reader_api() -> APIClient:
    """An API client authenticated as staff who may read live tasks."""
    client = APIClient()
    client.force_authenticate(user_with("view_livetask", username="reader"))
    return client

"""The admin's addresses, and readers of its pages: their text, rows and messages."""

from __future__ import annotations

import html
import re

from django.test import Client
from django.urls import reverse

Q = "emails"  # a queue of the tests' own; settings.RTQ["QUEUES"] has default and low
DASHBOARD = "/admin/django_rtq/livetask/"


def tasks_url(state: str, **query: str) -> str:
    url = reverse("admin:django_rtq_tasks", args=[state])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def task_url(task_id: str, queue: str = Q) -> str:
    return reverse("admin:django_rtq_task", args=[task_id]) + f"?queue={queue}"


ACTION_URL = "/admin/django_rtq/livetask/actions/tasks/"


def messages_of(response) -> list[str]:
    """The messages shown after a response: on the page it redirects to, or on itself."""
    page = response.client.get(response["Location"]) if response.status_code == 302 else response
    return [str(message) for message in page.context["messages"]]


def text(response) -> str:
    """The page's text with HTML entities decoded (quotes, ampersands)."""
    return html.unescape(response.content.decode())


def confirm(client: Client, url: str, data: dict, **options):
    """Post an action, check that it asks first (and does nothing yet), then confirm it."""
    asked = client.post(url, data)
    assert asked.status_code == 200
    assert "Are you sure?" in text(asked)
    return client.post(url, {**data, "confirm": "yes"}, **options)


def row_ids(response) -> list[str]:
    return re.findall(r'<tr data-task-id="([^"]+)"', response.text)

"""The REST API (Django REST framework): mount `django_rtq.api.urls`; needs the `api` extra."""

from ..extras import require_extra

require_extra("api", "django_rtq.api (the REST API)")

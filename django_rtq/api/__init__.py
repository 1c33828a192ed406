"""The REST API (Django REST framework): mount `django_rtq.api.urls`; needs the `api` extra."""

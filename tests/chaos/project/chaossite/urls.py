"""The chaos project's URLs: the requests of tests/chaos/test_outbox.py."""

from chaosapp import views
from django.urls import path

urlpatterns = [
    path("orders/<str:key>", views.place_order),
    path("orders/<str:key>/django-task", views.place_order_with_django_task),
]

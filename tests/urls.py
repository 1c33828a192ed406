"""URLs of the test project: the admin (and django-rtq's live views in it), the API and the metrics."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("rtq/api/", include("django_rtq.api.urls")),
    path("rtq/metrics/", include("django_rtq.metrics.urls")),
]

"""URLs of the API: `path("rtq/api/", include("django_rtq.api.urls"))`; the schema is at `schema/`."""

from django.urls import path, re_path

from . import views
from .routes import api_urlpatterns

app_name = "rtq_api"

urlpatterns = [
    *api_urlpatterns,
    path("schema/", views.SchemaView.as_view(patterns=api_urlpatterns), name="schema"),
    # Last: anything else under the API's prefix is a JSON 404, not Django's HTML page.
    re_path(r"", views.NotFoundView.as_view(), name="not-found"),
]

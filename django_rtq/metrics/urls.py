"""URLs of the metrics: `path("rtq/metrics/", include("django_rtq.metrics.urls"))`."""

from django.urls import path

from .views import MetricsView

app_name = "rtq_metrics"

urlpatterns = [path("", MetricsView.as_view(), name="metrics")]

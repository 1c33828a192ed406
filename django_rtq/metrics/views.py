"""The metrics view: Prometheus' text format, guarded by the API's authentication and permissions."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from prometheus_client.exposition import choose_encoder
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from ..api.permissions import ConfiguredAccessMixin
from ..operations import Operations
from ..permissions import VIEW_LIVE
from .collector import registry_for


class ErrorsAsJSON(BaseContentNegotiation):
    """Refusals go out as JSON whatever the scraper accepts: the metrics choose their own format
    (`choose_encoder`), so an Accept header DRF cannot render must not end in 406 first."""

    def select_parser(self, request: Request, parsers: list[Any]) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(
        self, request: Request, renderers: list[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        return renderers[0], renderers[0].media_type


class MetricsView(ConfiguredAccessMixin, APIView):
    # Access from RTQ["API_AUTHENTICATION_CLASSES"] / ["API_PERMISSION_CLASSES"], as the API.

    required_permission = VIEW_LIVE
    renderer_classes = [JSONRenderer]
    content_negotiation_class = ErrorsAsJSON
    schema = None  # not part of the API's OpenAPI schema

    def get(self, request: Request) -> HttpResponse:
        # Admitted by the permission classes: they are the policy (see APIBase).
        registry = registry_for(Operations(request.user, check_permissions=False))
        encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
        response = HttpResponse(encoder(registry), content_type=content_type)
        response["Cache-Control"] = "no-store"
        return response

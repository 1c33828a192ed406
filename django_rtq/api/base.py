"""What every view of the API shares: access from the RTQ settings, JSON, and the operations layer."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.openapi import AutoSchema
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..operations import Operations
from .exceptions import translate
from .parsers import BoundedJSONParser, check_json_body
from .permissions import ConfiguredAccessMixin


class APIBase(ConfiguredAccessMixin, APIView):
    # JSON in and out, access from the RTQ settings, django-rtq's errors as HTTP errors. (No
    # docstrings on the views: drf-spectacular would show them as operation descriptions.)

    schema = AutoSchema()
    parser_classes = [BoundedJSONParser]
    renderer_classes = [JSONRenderer]  # the browsable API would need "rest_framework" installed
    #: What `RTQPermissions` (the default permission class) asks of the user; None: no one.
    required_permission: str | tuple[str, ...] | None = None
    #: The operations layer, once the request is admitted. The permission classes are the API's
    #: access policy (RTQPermissions by default; RTQ["API_PERMISSION_CLASSES"] may replace it),
    #: so the operations act for the user without checking their permissions again.
    ops: Operations

    def object_permission(self, obj: Any) -> str | None:
        """The permission an object the view found needs besides `required_permission`."""
        return None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authenticated and admitted first
        if request.method == "POST" and hasattr(self, "post"):
            check_json_body(request)
        self.ops = Operations(request.user, check_permissions=False)

    def handle_exception(self, exc: Exception) -> Response:
        return super().handle_exception(translate(exc))

    def query(self, serializer_class: type[Any]) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.query_params)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    def url(self, name: str, **kwargs: Any) -> str:
        namespace = self.request.resolver_match.namespace if self.request.resolver_match else "rtq_api"
        return self.request.build_absolute_uri(reverse(f"{namespace}:{name}", kwargs=kwargs))

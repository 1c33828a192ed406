"""OpenAPI glue: drf-spectacular's AutoSchema on the API's views, whatever DEFAULT_SCHEMA_CLASS says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema

from .serializers import ErrorSerializer

#: Responses every operation may give.
ACCESS_RESPONSES = {
    401: OpenApiResponse(
        ErrorSerializer, description="Not authenticated (with authentication that says so)."
    ),
    403: OpenApiResponse(ErrorSerializer, description="Not authenticated, or not allowed."),
    503: OpenApiResponse(ErrorSerializer, description="Redis could not be reached."),
}
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="Not found.")
CONFLICT = OpenApiResponse(ErrorSerializer, description="The task's state does not allow it.")
INVALID = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="Invalid input, by field, e.g. "
    '{"kwargs": {"count": ["missing required argument"]}} or {"priority": ["..."]}.',
)


def documented(*, responses: dict[int, Any], **kwargs: Any) -> Callable[[Callable], Callable]:
    """`extend_schema` for a view method, with the access responses added."""

    def decorator(method: Callable) -> Callable:
        # extend_schema extends the schema class it finds here, else DEFAULT_SCHEMA_CLASS, which
        # projects need not have set to drf-spectacular's.
        method.schema = AutoSchema  # type: ignore[attr-defined]
        kwargs.setdefault("description", kwargs.get("summary", "") + ".")  # not a class docstring
        return extend_schema(responses={**responses, **ACCESS_RESPONSES}, **kwargs)(method)

    return decorator

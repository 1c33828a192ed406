"""OpenAPI glue: drf-spectacular's AutoSchema on the API's views, whatever DEFAULT_SCHEMA_CLASS says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent, build_choice_description_list
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema

from .serializers import STATE_CHOICES, ErrorSerializer, TaskStateField

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
#: The `Location` header of an answer that created or started something.
LOCATION = OpenApiParameter(
    "Location",
    location=OpenApiParameter.HEADER,
    response=[201, 202],
    description="The URL of what was created or started.",
)
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


class TaskStateFieldExtension(OpenApiSerializerFieldExtension):
    """Every `TaskStateField` refers to the one `TaskStateEnum`, the enum `TaskSerializer.state` is
    given: drf-spectacular would otherwise name the same states anew under each field's name."""

    target_class = TaskStateField

    def map_serializer_field(self, auto_schema: AutoSchema, direction: str) -> dict[str, Any]:
        enum = ResolvedComponent(
            name="TaskStateEnum",
            type=ResolvedComponent.SCHEMA,
            object="TaskStateEnum",
            schema={
                "enum": STATE_CHOICES,
                "type": "string",
                "description": build_choice_description_list((state, state) for state in STATE_CHOICES),
            },
        )
        auto_schema.registry.register_on_missing(enum)
        return enum.ref

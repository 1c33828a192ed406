"""The API's own error responses, and django-rtq's errors translated into them."""

from __future__ import annotations

from rest_framework import exceptions, status

from ..exceptions import (
    BrokerUnavailable,
    BulkJobNotFound,
    InvalidStateTransition,
    QueueNotFound,
    TaskNotFound,
)


class Conflict(exceptions.APIException):
    """The task's state, or a task already there, does not allow the request."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the task's current state."
    default_code = "conflict"


class ServiceUnavailable(exceptions.APIException):
    """Redis could not be reached."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Redis could not be reached; try again later."
    default_code = "broker_unavailable"


def translate(exc: Exception) -> Exception:
    """Return the API error for a django-rtq error, or `exc` itself."""
    if isinstance(exc, TaskNotFound | QueueNotFound | BulkJobNotFound):
        return exceptions.NotFound(str(exc))
    if isinstance(exc, InvalidStateTransition):
        return Conflict(str(exc))
    if isinstance(exc, BrokerUnavailable):
        return ServiceUnavailable()
    return exc

"""The API's request bodies: JSON only, bounded in depth, and an empty body taken as `{}`."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser
from rest_framework.request import Request

#: Deepest nesting of arrays and objects a request body may have.
MAX_JSON_DEPTH = 100
JSON_MEDIA_TYPE = "application/json"


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser (strict: no NaN), refusing bodies nested deeper than MAX_JSON_DEPTH with a 400."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # the json module's own recursion, far deeper than the limit
            raise ParseError(too_deep()) from None
        if json_depth(data) > MAX_JSON_DEPTH:
            raise ParseError(too_deep())
        return data


def too_deep() -> str:
    return f"JSON nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays and objects."


def json_depth(data: Any) -> int:
    """How deeply arrays and objects nest in `data` (0 for a scalar); iterative, so any depth will do."""
    deepest = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def media_type(request: Request) -> str:
    """The request's media type, lower-cased, without its parameters ("" when there is none)."""
    return request.content_type.split(";", 1)[0].strip().lower()


def body_length(request: Request) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


def check_json_body(request: Request) -> None:
    """Every POST is JSON: `application/json`, or an empty body of any content type (taken as `{}`).

    An empty body is `{}` whatever its content type says: `curl -X POST` sends none, and a WSGI
    server may name one anyway (wsgiref, under `runserver`, gives `text/plain`). A body is parsed
    now, even where the view reads none, so that a broken one is a 400 everywhere; a body of any
    other content type is a 415.
    """
    if not body_length(request):
        return  # DRF reads an empty body as no data at all (an empty dict, or QueryDict for a form)
    if media_type(request) != JSON_MEDIA_TYPE:
        raise UnsupportedMediaType(media_type(request) or "(none)")
    request.data  # noqa: B018 -- parse it: ParseError (400) if it is not JSON

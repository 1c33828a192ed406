"""Pages of lists: `limit` and `offset` in, `count`, `next`, `previous` and `results` out."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.utils.urls import remove_query_param, replace_query_param

from ..conf import get_settings
from .serializers import MAX_PAGE_SIZE


def page_bounds(query: dict[str, Any]) -> tuple[int, int]:
    """Return (offset, limit) from a validated page query; limit defaults to API_PAGE_SIZE."""
    limit = query.get("limit") or min(max(1, int(get_settings().API_PAGE_SIZE)), MAX_PAGE_SIZE)
    return query.get("offset", 0), limit


def page_data(request: Request, *, count: int, offset: int, limit: int, results: list[Any]) -> dict[str, Any]:
    url = request.build_absolute_uri()
    url = replace_query_param(url, "limit", limit)
    following = replace_query_param(url, "offset", offset + limit) if offset + limit < count else None
    previous = None
    if offset > 0:
        back = max(0, min(offset, count) - limit)
        previous = replace_query_param(url, "offset", back) if back else remove_query_param(url, "offset")
    return {
        "count": count,
        "limit": limit,
        "offset": offset,
        "next": following,
        "previous": previous,
        "results": results,
    }

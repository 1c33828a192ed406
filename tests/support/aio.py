"""Running a coroutine from a synchronous test."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections


def run_async(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine as a test would outside a request: the ORM queries it makes run in
    asgiref's thread, whose connection nothing else closes (an ASGI request would), so close
    them after."""

    async def then_close():
        try:
            return await coroutine
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(then_close())

"""cancel_on_disconnect: run a handler under a watcher of the ASGI receive channel (vLLM's
with_cancellation). A client that disconnects cancels the handler, whose aclosing chain aborts the
engine request; polling `request.is_disconnected()` is avoided because it breaks behind middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect
from starlette.types import Receive

T = TypeVar("T")


async def _wait_for_disconnect(receive: Receive) -> None:
    # Called after the body was read, so the only message left to come is http.disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(receive: Receive, coro: Coroutine[Any, Any, T]) -> T:
    """Await coro; if the client disconnects first, cancel it and raise ClientDisconnect."""
    handler = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        done, _ = await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not handler.done():
            handler.cancel()
        # Let the handler run its finally blocks (engine aborts) before we return.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(handler, watcher, return_exceptions=True)
    if handler in done:
        return handler.result()
    raise ClientDisconnect()

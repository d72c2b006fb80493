"""SSE framing (`data: {json}\n\n`, `[DONE]`, error frames) and the event-stream response."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.cancel import cancel_on_disconnect

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(payload: BaseModel | Mapping[str, Any]) -> bytes:
    """One `data:` event; pydantic models are dumped as their JSON wire form."""
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json()
    else:
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + body.encode() + b"\n\n"


def error_frame(error: Mapping[str, Any]) -> bytes:
    """The mid-stream failure frame: `data: {"error": {...}}` (send DONE after it)."""
    return frame({"error": dict(error)})


class EventStreamResponse(Response):
    """text/event-stream over an async generator of frames, closed deterministically.

    The frames generator is closed (aclosing) however the response ends, and the send loop runs
    under a watcher of the receive channel, so a client that leaves while the engine is quiet still
    aborts the engine request at once rather than at the next write.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        headers: Mapping[str, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(content=None, headers={**SSE_HEADERS, **(headers or {})})
        # Response would declare the empty body's content-length: 0; a stream has none.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._frames = frames
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stream() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in frames:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            async with aclosing(self._frames) as frames:
                await cancel_on_disconnect(receive, stream())
        except (ClientDisconnect, OSError):
            logger.info("client disconnected mid-stream")
            if self._on_disconnect is not None:
                self._on_disconnect()

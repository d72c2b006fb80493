"""SSE framing (`data: {json}\n\n`, `[DONE]`, error frames, keep-alive comments) and the
event-stream response."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from trtllm_gateway.web import request_context
from trtllm_gateway.web.cancel import cancel_on_disconnect

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients ignore it, proxies see traffic
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(payload: BaseModel | Mapping[str, Any] | bytes) -> bytes:
    """One `data:` event; pydantic models are dumped as their JSON wire form, bytes are JSON
    already (a pre-rendered chunk)."""
    if isinstance(payload, bytes):
        return b"data: " + payload + b"\n\n"
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json()
    else:
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + body.encode() + b"\n\n"


def error_frame(error: Mapping[str, Any]) -> bytes:
    """The mid-stream failure frame: `data: {"error": {...}}` (send DONE after it)."""
    return frame({"error": dict(error)})


class StalledClientError(Exception):
    """The client took no bytes for the write timeout: the stream is ended as if it had left."""


class EventStreamResponse(Response):
    """text/event-stream over an async generator of frames, closed deterministically.

    The frames generator is closed (aclosing) however the response ends, and the send loop runs
    under a watcher of the receive channel, so a client that leaves while the engine is quiet still
    aborts the engine request at once rather than at the next write.

    A client that stays connected but stops reading is ended too: once the socket's buffers are
    full, uvicorn's send() waits for them to drain (its flow control), and a send that waits
    longer than `write_timeout_s` ends the stream the same way (engine aborted, slots released).
    Before this bound one raw socket with n=8 that never read held 8 admission slots for as long
    as it stayed open, the engine long idle (issue 40, item 3).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[bytes, None],
        headers: Mapping[str, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        keepalive_s: float = 0.0,
        write_timeout_s: float = 0.0,
    ) -> None:
        super().__init__(content=None, headers={**SSE_HEADERS, **(headers or {})})
        # Response would declare the empty body's content-length: 0; a stream has none.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._frames = frames
        self._on_disconnect = on_disconnect
        self._keepalive_s = keepalive_s
        self._write_timeout_s = write_timeout_s or None  # 0: no bound
        self._on_close: list[Callable[[], None]] = []

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the response has ended, however it ended (admission release)."""
        self._on_close.append(callback)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Per chunk only two clock reads: no lock, no timeout context (a lock and asyncio.timeout
        # per send were ~15% of an API server's time a chunk). One watcher task a stream ends a
        # send that waits past the write timeout; a keep-alive goes out only between sends.
        sending_since: float | None = None  # a send in flight since then
        last_sent = time.monotonic()
        finished = False

        async def send_body(chunk: bytes, more: bool = True) -> None:
            nonlocal sending_since, last_sent
            sending_since = time.monotonic()
            try:
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
            finally:
                sending_since = None
            last_sent = time.monotonic()

        async def watch(limit: float) -> None:
            while True:
                since, now = sending_since, time.monotonic()
                if since is not None and now - since >= limit:
                    raise StalledClientError
                await asyncio.sleep(limit / 4 if since is None else since + limit - now)

        async def keepalive(interval: float) -> None:
            # One task per stream, not one per token: sleep until `interval` of silence is due.
            while True:
                await asyncio.sleep(max(0.0, last_sent + interval - time.monotonic()))
                idle = time.monotonic() - last_sent >= interval
                if idle and sending_since is None and not finished:
                    await send_body(KEEPALIVE)

        async def stream() -> None:
            nonlocal finished
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            # A stalled send (a frame's or a keep-alive's) ends the stream: the group cancels
            # the frame loop.
            async with asyncio.TaskGroup() as group:
                helpers = []
                if self._write_timeout_s is not None:
                    helpers.append(
                        group.create_task(watch(self._write_timeout_s), name="sse-watch")
                    )
                if self._keepalive_s > 0:
                    ticker = keepalive(self._keepalive_s)
                    helpers.append(group.create_task(ticker, name="sse-keepalive"))
                async for chunk in frames:
                    await send_body(chunk)
                finished = True
                await send_body(b"", more=False)
                for task in helpers:
                    task.cancel()

        try:
            async with aclosing(self._frames) as frames:
                await cancel_on_disconnect(receive, stream())
        except* StalledClientError:
            # Returning with the response unfinished makes uvicorn close the connection.
            logger.warning("client read nothing for %ss; stream ended", self._write_timeout_s)
            self._disconnected()
        except* (ClientDisconnect, OSError):
            logger.info("client disconnected mid-stream")
            self._disconnected()
        finally:
            for callback in self._on_close:
                callback()

    def _disconnected(self) -> None:
        ctx = request_context.current()
        if ctx is not None:
            ctx.disconnected = True
        if self._on_disconnect is not None:
            self._on_disconnect()

"""The per-request context: the request_id (X-Request-Id in and out) and the end-of-request log.

RequestContextMiddleware (pure ASGI, outermost) takes a valid client X-Request-Id or makes one,
keeps it in a contextvar so every log line of the request carries it, echoes it on the response,
and logs one structured line when the response has ended. Generation routes refine the context
(their `chatcmpl-…` id, model, token counts, TTFT, finish reasons) through `current()`.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Collection
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_gateway.engine.protocol import Timings

logger = logging.getLogger("trtllm_gateway.access")

HEADER = "x-request-id"
_VALID_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


@dataclass(slots=True)
class RequestContext:
    """One HTTP request's identity and outcome; mutable, shared by the tasks the request spawns."""

    request_id: str
    client_supplied: bool = False
    status: int = 0
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    finish_reasons: list[str] = field(default_factory=list)
    disconnected: bool = False
    timings: Timings | None = None  # the engine's, from the last final event (traces read it)

    def fields(self, method: str, path: str, e2e_s: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "method": method,
            "path": path,
            "status": self.status,
            "e2e_s": round(e2e_s, 4),
        }
        if self.model is not None:
            out |= {
                "model": self.model,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
                "finish_reason": ",".join(self.finish_reasons) or None,
            }
        if self.disconnected:
            out["client_disconnected"] = True
        return out


_current: ContextVar[RequestContext | None] = ContextVar("request_context", default=None)


def current() -> RequestContext | None:
    return _current.get()


def current_request_id() -> str:
    ctx = _current.get()
    return ctx.request_id if ctx is not None else "-"


def new_request_id(prefix: str) -> str:
    """The id a generation route uses: the client's X-Request-Id, else `{prefix}-{hex}`."""
    ctx = _current.get()
    if ctx is not None and ctx.client_supplied:
        return ctx.request_id
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    if ctx is not None:
        ctx.request_id = request_id
    return request_id


class RequestContextMiddleware:
    """Sets the context, echoes X-Request-Id, logs one line per request (quiet paths at DEBUG)."""

    def __init__(self, app: ASGIApp, quiet_paths: Collection[str] = ()) -> None:
        self.app = app
        self.quiet_paths = frozenset(quiet_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get(HEADER, "").strip()
        valid = _VALID_ID.fullmatch(header) is not None
        ctx = RequestContext(header if valid else uuid.uuid4().hex, client_supplied=valid)
        token = _current.set(ctx)
        start = time.monotonic()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                ctx.status = message["status"]
                MutableHeaders(scope=message)[HEADER] = ctx.request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            ctx.status = ctx.status or 500
            raise
        finally:
            path = scope["path"]
            level = logging.DEBUG if path in self.quiet_paths else logging.INFO
            fields = ctx.fields(scope["method"], path, time.monotonic() - start)
            logger.log(level, "request", extra={"fields": fields})
            _current.reset(token)

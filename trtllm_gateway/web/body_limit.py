"""BodyLimitMiddleware: a request body past --max-body-bytes is a 413 before it is buffered.

A declared Content-Length past the limit is refused before the body is read; a chunked body is
counted as it arrives and refused at the first chunk past the limit (a 200 MB chunked body used
to be buffered whole before anything looked at it). Both answers are OpenAI-shaped errors.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_gateway.web.errors import GatewayError, error_body


class BodyTooLargeError(GatewayError):
    status_code = 413
    error_type = "BadRequestError"
    default_code = "request_too_large"


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> BodyTooLargeError:
        return BodyTooLargeError(f"the request body is larger than {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            err = self._error()
            body = error_body(err.message, err.error_type, None, err.code)
            await JSONResponse(body, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # An HTTPException, which FastAPI's body parsing lets through (it turns
                    # any other exception into "error parsing the body"); the app's error
                    # handler renders it OpenAI-shaped.
                    raise HTTPException(413, self._error().message)
            return message

        await self.app(scope, counted, send)

"""ForwardCallerAuth: a pure ASGI middleware that makes the caller's Authorization header
available to the engine layer (engine.protocol.CALLER_AUTHORIZATION), so remote prefill calls
carry the caller's auth to sibling instances. Pure ASGI keeps the contextvar in the handler's task.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_gateway.engine.protocol import CALLER_AUTHORIZATION


class ForwardCallerAuth:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        token = CALLER_AUTHORIZATION.set(auth.decode("latin-1") if auth else None)
        try:
            await self.app(scope, receive, send)
        finally:
            CALLER_AUTHORIZATION.reset(token)

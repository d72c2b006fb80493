"""API-key auth: `Authorization: Bearer KEY` (or `X-Api-Key`) on every path but the public ones.

Keys come from --api-key (repeatable, comma list, GATEWAY_API_KEY) and --api-key-file. The check
compares SHA-256 digests with hmac.compare_digest against every key, without an early exit, so
timing reveals neither a key nor which key matched. Keys and presented tokens are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_gateway.app.errors import error_body
from trtllm_gateway.config.settings import Settings


def load_api_keys(settings: Settings) -> list[str]:
    """--api-key values plus --api-key-file lines (blank lines and '#' comments skipped)."""
    keys = [k.get_secret_value() for k in settings.api_key]
    if settings.api_key_file is not None:
        for line in settings.api_key_file.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    return [k for k in keys if k]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def presented_token(headers: Headers) -> str | None:
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or None


class ApiKeyMiddleware:
    """401 with an OpenAI error body unless the request carries one of the keys."""

    def __init__(self, app: ASGIApp, keys: Sequence[str], public_paths: Collection[str]) -> None:
        if not keys:
            raise ValueError("ApiKeyMiddleware needs at least one key")
        self.app = app
        self._digests = tuple(_digest(k) for k in keys)
        self._public = frozenset(public_paths)

    def authorized(self, token: str | None) -> bool:
        presented = _digest(token or "")
        ok = False
        for digest in self._digests:
            ok |= hmac.compare_digest(presented, digest)
        return ok and token is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._public:
            await self.app(scope, receive, send)
            return
        if self.authorized(presented_token(Headers(scope=scope))):
            await self.app(scope, receive, send)
            return
        body = error_body(
            "Invalid or missing API key. Send it as 'Authorization: Bearer KEY'.",
            "AuthenticationError",
            None,
            "invalid_api_key",
        )
        response = JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

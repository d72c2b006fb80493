"""API-key auth: `Authorization: Bearer KEY` (or `X-Api-Key`) on every path but the public ones.

Two credentials, two sets of paths. Client keys (--api-key, repeatable, comma list,
GATEWAY_API_KEY, and --api-key-file) open the public API. The sibling and router endpoints under
/internal/ (prefill, KV pulls, encode, KV events, load) take only the internal key
(--internal-api-key), which siblings present to each other; without one they answer 403, so a
client of the public port can never read another user's KV or prompt tokens. Each check compares
SHA-256 digests with hmac.compare_digest against every key, without an early exit, so timing
reveals neither a key nor which key matched. Keys and presented tokens are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_gateway.config.server import ServerConfig
from trtllm_gateway.web.errors import ANTHROPIC_PREFIX, anthropic_body, error_body

INTERNAL_PREFIX = "/internal/"


def load_api_keys(server: ServerConfig) -> list[str]:
    """--api-key values plus --api-key-file lines (blank lines and '#' comments skipped)."""
    keys = [k.get_secret_value() for k in server.api_key]
    if server.api_key_file is not None:
        for line in server.api_key_file.read_text().splitlines():
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


def _matches(token: str | None, digests: Sequence[bytes]) -> bool:
    presented = _digest(token or "")
    ok = False
    for digest in digests:
        ok |= hmac.compare_digest(presented, digest)
    return ok and token is not None


def _refuse(scope: Scope, status: int, message: str, code: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    body = error_body(message, "AuthenticationError", None, code)
    if scope["path"].startswith(ANTHROPIC_PREFIX):  # Anthropic's clients send x-api-key
        body = anthropic_body(status, message)
    return JSONResponse(body, status_code=status, headers=headers)


class ApiKeyMiddleware:
    """401 with an OpenAI error body unless the request carries one of the client keys.

    /internal/ paths are InternalKeyMiddleware's: a client key does not open them.
    """

    def __init__(self, app: ASGIApp, keys: Sequence[str], public_paths: Collection[str]) -> None:
        if not keys:
            raise ValueError("ApiKeyMiddleware needs at least one key")
        self.app = app
        self._digests = tuple(_digest(k) for k in keys)
        self._public = frozenset(public_paths)

    def authorized(self, token: str | None) -> bool:
        return _matches(token, self._digests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self._public or path.startswith(INTERNAL_PREFIX):
            await self.app(scope, receive, send)
            return
        if self.authorized(presented_token(Headers(scope=scope))):
            await self.app(scope, receive, send)
            return
        message = "Invalid or missing API key. Send it as 'Authorization: Bearer KEY'."
        await _refuse(scope, 401, message, "invalid_api_key")(scope, receive, send)


class InternalKeyMiddleware:
    """/internal/ paths: 403 without --internal-api-key, else 401 unless it is presented."""

    def __init__(self, app: ASGIApp, internal_key: str | None) -> None:
        self.app = app
        self._digests = (_digest(internal_key),) if internal_key else ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(INTERNAL_PREFIX):
            await self.app(scope, receive, send)
            return
        if not self._digests:
            message = (
                "The sibling and router endpoints are off: start every instance of the "
                "deployment with the same --internal-api-key (docs/operations.md)."
            )
            await _refuse(scope, 403, message, "internal_endpoints_off")(scope, receive, send)
            return
        if _matches(presented_token(Headers(scope=scope)), self._digests):
            await self.app(scope, receive, send)
            return
        message = "This endpoint takes the internal key (--internal-api-key), not a client key."
        await _refuse(scope, 401, message, "invalid_internal_key")(scope, receive, send)

"""The gateway's error tree and the one place that turns errors into OpenAI error JSON.

    GatewayError                       (status, type, code)
    ├── BadRequestError                400 BadRequestError
    ├── NotFoundError                  404 NotFoundError
    │   └── ModelNotFoundError         404 NotFoundError / model_not_found
    └── ServiceUnavailableError        503 ServiceUnavailableError (loading, draining, dead)

    EngineError (engine/protocol.py)   mapped by _ENGINE_ERRORS below:
    ├── InvalidRequestError            400 (ContextTooLongError: code context_length_exceeded)
    ├── OverloadedError                503 + Retry-After
    ├── EngineDeadError                503
    ├── RequestFailedError             500 / request_failed (the engine's fault; it goes on)
    └── RemotePrefillFailedError       503

    MediaError (multimodal/errors.py)  its own status_code: 400 refused image, 502 image host
                                       failed (BadGatewayError), 504 fetch timed out

Body: {"error": {"message", "type", "param", "code"}}. Validation errors are 400, never 422.
Under /v1/messages (Anthropic's Messages API) the same errors take Anthropic's shape,
{"type": "error", "error": {"type", "message"}}, and an overload (a full queue, the engine's
OverloadedError) is 529 overloaded_error, as Anthropic answers it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    EngineDeadError,
    EngineError,
    InvalidRequestError,
    OverloadedError,
    RemotePrefillFailedError,
    RequestFailedError,
)
from trtllm_gateway.multimodal import MediaError

logger = logging.getLogger(__name__)

RETRY_AFTER_S = "1"


class GatewayError(Exception):
    status_code = 500
    error_type = "InternalServerError"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.headers = headers  # sent with the error (a busy prefill sibling's queue)


class BadRequestError(GatewayError):
    status_code = 400
    error_type = "BadRequestError"


class NotFoundError(GatewayError):
    status_code = 404
    error_type = "NotFoundError"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class ServiceUnavailableError(GatewayError):
    status_code = 503
    error_type = "ServiceUnavailableError"


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    # A message may quote the request (a model name): a lone surrogate there would make the
    # body unencodable, the error a 500. Spelled as \udXXX escapes, it renders.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if param is not None:
        param = param.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def from_engine_error(exc: EngineError) -> GatewayError:
    """The HTTP meaning of an engine error (also used for mid-stream error frames)."""
    if isinstance(exc, ContextTooLongError):
        return BadRequestError(str(exc), code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return BadRequestError(str(exc), param=exc.param)
    if isinstance(exc, OverloadedError):
        return ServiceUnavailableError(str(exc) or "Server overloaded", code="overloaded")
    if isinstance(exc, EngineDeadError):
        return ServiceUnavailableError(str(exc) or "Engine is dead", code="engine_dead")
    if isinstance(exc, RequestFailedError):
        return GatewayError(str(exc) or "The engine failed this request", code="request_failed")
    if isinstance(exc, RemotePrefillFailedError):
        return ServiceUnavailableError(str(exc) or "Remote prefill failed", code="prefill_failed")
    return GatewayError("Internal engine error")


def as_gateway_error(exc: BaseException) -> GatewayError:
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, EngineError):
        return from_engine_error(exc)
    if isinstance(exc, MediaError):
        return from_media_error(exc)
    return GatewayError("Internal server error")


_MEDIA_ERROR_TYPES = {400: "BadRequestError", 502: "BadGatewayError", 504: "GatewayTimeoutError"}


def from_media_error(exc: MediaError) -> GatewayError:
    """An image that could not be loaded: 400 (refused), 502 (its host failed) or 504."""
    err = GatewayError(exc.message, param=exc.param, code=exc.code)
    err.status_code = exc.status_code
    err.error_type = _MEDIA_ERROR_TYPES.get(exc.status_code, "BadRequestError")
    return err


def error_payload(exc: BaseException) -> dict[str, Any]:
    err = as_gateway_error(exc)
    return error_body(err.message, err.error_type, err.param, err.code)


ANTHROPIC_PREFIX = "/v1/messages"
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_OVERLOAD_CODES = ("queue_full", "overloaded")


def anthropic_body(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Status and body of an error in Anthropic's shape (also its mid-stream `error` event)."""
    err = as_gateway_error(exc)
    status = 529 if err.status_code == 503 and err.code in _OVERLOAD_CODES else err.status_code
    return status, anthropic_body(status, err.message)


def _response(err: GatewayError, request: Request | None = None) -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if err.status_code == 503 else {}
    headers |= err.headers or {}
    if request is not None and request.url.path.startswith(ANTHROPIC_PREFIX):
        status, body = anthropic_error(err)
        return JSONResponse(body, status_code=status, headers=headers)
    body = error_body(err.message, err.error_type, err.param, err.code)
    return JSONResponse(body, status_code=err.status_code, headers=headers)


def clean_loc(loc: Sequence[str | int]) -> str | None:
    """('body', 'messages', 0, 'content', 'str') -> 'messages[0].content' (vLLM's clean_loc)."""
    parts: list[str] = []
    for seg in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(seg, int):
            if not parts:
                break
            parts[-1] += f"[{seg}]"
        elif "[" in seg or "-" in seg or seg in {"str", "int", "float", "bool", "list", "dict"}:
            break  # pydantic union/validator tags, not field names
        else:
            parts.append(seg)
    return ".".join(parts) or None


def _validation_error(exc: RequestValidationError) -> GatewayError:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return BadRequestError("Invalid JSON body", code="invalid_json")
    messages = []
    for e in errors[:5]:
        where = clean_loc(e.get("loc", ()))
        msg = str(e.get("msg", "invalid value"))
        messages.append(f"{where}: {msg}" if where else msg)
    param = clean_loc(errors[0].get("loc", ())) if errors else None
    return BadRequestError("; ".join(messages) or "Invalid request", param=param)


def install_error_handlers(app: FastAPI, on_disconnect: Any = None) -> None:
    """Register every handler; `on_disconnect()` counts clients that left before the response."""

    async def gateway_error(request: Request, exc: Exception) -> Response:
        err = as_gateway_error(exc)
        if err.status_code >= 500:
            logger.warning("%s: %s", type(exc).__name__, err.message)
        return _response(err, request)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _response(_validation_error(exc), request)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        err = GatewayError(str(exc.detail))
        err.status_code = exc.status_code
        err.error_type = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        return _response(err, request)

    async def client_disconnect(_: Request, exc: Exception) -> Response:
        logger.info("client disconnected before the response")
        if on_disconnect is not None:
            on_disconnect()
        return Response(status_code=499)

    async def unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error", exc_info=exc)
        return _response(GatewayError("Internal server error"), request)

    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(EngineError, gateway_error)
    app.add_exception_handler(MediaError, gateway_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, client_disconnect)
    app.add_exception_handler(Exception, unexpected)

"""GET /health (503 + OpenAI error body unless the engine is ready) and GET /version."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from trtllm_gateway.web.deps import StateDep
from trtllm_gateway.web.errors import error_body
from trtllm_gateway.web.version import VERSION

router = APIRouter(tags=["health"])

_MESSAGES = {
    "loading": "The model is loading.",
    "draining": "The server is draining.",
    "dead": "The engine is dead.",
}


@router.get("/health", response_model=None)
async def health(state: StateDep) -> JSONResponse:
    h = state.health()
    status: dict[str, Any] = {
        "status": h.state,
        "running": h.running,
        "waiting": h.waiting,
        "kv_usage": h.kv_usage,
    }
    if h.state == "ready":
        return JSONResponse(status)
    message = _MESSAGES.get(h.state, "Not ready.")
    if h.detail:
        message = f"{message} {h.detail}"
    body = error_body(message, "ServiceUnavailableError", None, f"engine_{h.state}")
    return JSONResponse({**body, **status}, status_code=503, headers={"Retry-After": "1"})


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": VERSION}

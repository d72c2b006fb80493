"""Helpers for the operations api tests: an app with extra settings, run under its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from tests.conftest import MODEL, wait_ready
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.drain import Drain
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.web.state import State

CHAT: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
}


def drain_of(app: FastAPI) -> Drain:
    drain: Drain = app.state.drain
    return drain


def state_of(app: FastAPI) -> State:
    state = drain_of(app).state
    assert state is not None
    return state


@contextlib.asynccontextmanager
async def serve(
    settings: Settings, engine: FakeEngine, **overrides: Any
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """create_app with `overrides` applied (and validated); yields the app and a ready client."""
    app = create_app(Settings(**{**settings.model_dump(), **overrides}).parts(), engine=engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await wait_ready(client)
            yield app, client


async def wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    async with asyncio.timeout(limit_s):
        while not predicate():  # noqa: ASYNC110 - polls a plain counter
            await asyncio.sleep(0.005)


async def post_then_leave(app: FastAPI, path: str, body: bytes, after_s: float = 0.2) -> None:
    """POST `body` straight through the ASGI app, then disconnect after `after_s` (before the
    first byte when the engine is slower): httpx's ASGITransport cannot leave mid-request."""
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(after_s)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 1234),
        "server": ("test", 80),
    }
    async with asyncio.timeout(5):
        await app(scope, receive, send)

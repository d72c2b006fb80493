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
from trtllm_gateway.app.drain import Drain
from trtllm_gateway.app.main import create_app
from trtllm_gateway.app.state import State
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.fake import FakeEngine

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
    app = create_app(Settings(**{**settings.model_dump(), **overrides}), engine=engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await wait_ready(client)
            yield app, client


async def wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    async with asyncio.timeout(limit_s):
        while not predicate():  # noqa: ASYNC110 - polls a plain counter
            await asyncio.sleep(0.005)

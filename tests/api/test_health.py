"""GET /health (503 while loading or dead, 200 when ready) and GET /version."""

from __future__ import annotations

import asyncio

import httpx
from asgi_lifespan import LifespanManager

from tests.conftest import MODEL, wait_ready
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings


async def test_ready(client: httpx.AsyncClient) -> None:
    r = await client.get("/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ready"


async def test_version(client: httpx.AsyncClient) -> None:
    r = await client.get("/version")
    assert r.status_code == 200
    assert r.json()["version"]


async def test_loading_is_503_then_ready(settings: Settings, fake_engine: FakeEngine) -> None:
    fake_engine.load_delay_s = 0.5
    app = create_app(settings.parts(), engine=fake_engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            r = await client.get("/health")
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "ServiceUnavailableError"
            assert r.json()["error"]["code"] == "engine_loading"
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            r = await client.post("/v1/chat/completions", json=chat)
            assert r.status_code == 503
            assert (await client.get("/v1/models")).status_code == 200
            await wait_ready(client)
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200


async def test_failed_start_is_dead(settings: Settings, fake_engine: FakeEngine) -> None:
    async def broken() -> None:
        raise RuntimeError("no weights")

    fake_engine.start = broken  # type: ignore[method-assign]
    app = create_app(settings.parts(), engine=fake_engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await asyncio.sleep(0.05)
            r = await client.get("/health")
            assert r.status_code == 503
            assert r.json()["status"] == "dead"
            assert "no weights" in r.json()["error"]["message"]

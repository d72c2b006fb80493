"""GET /health (503 while loading or dead, 200 when ready) and GET /version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager

from tests.conftest import MODEL, wait_ready
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.web.shared_counts import SharedCounts


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


async def test_ready_only_once_every_api_server_has_loaded(
    settings: Settings, fake_engine: FakeEngine, tmp_path: Path
) -> None:
    """--api-server-count 2: any server may take the next connection, so the first one loaded
    says 503 until the other has loaded too (a CI run got 200 from one server, then 503
    "still loading" from the other for its next request)."""
    counts = str(tmp_path / "admission")
    SharedCounts.create(counts, servers=2)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    first = create_app(settings.parts(), engine=fake_engine, shared=SharedCounts(counts))
    async with LifespanManager(first) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            waiting = "waiting for the other API servers (1 of 2 loaded)"
            async with asyncio.timeout(10):  # this one's engine and tokenizer loaded
                while waiting not in (r := await client.get("/health")).text:
                    assert r.status_code == 503, r.json()
                    await asyncio.sleep(0.01)
            assert r.status_code == 503, r.json()
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 503
            other = FakeEngine(fake_engine.info, fake_engine.script)
            second = create_app(settings.parts(), engine=other, shared=SharedCounts(counts))
            async with LifespanManager(second) as manager2:
                t2 = httpx.ASGITransport(app=manager2.app)
                async with httpx.AsyncClient(transport=t2, base_url="http://test") as client2:
                    await wait_ready(client2)
                    await wait_ready(client, timeout_s=1)
                    for c in (client, client2):
                        r = await c.post("/v1/chat/completions", json=chat)
                        assert r.status_code == 200

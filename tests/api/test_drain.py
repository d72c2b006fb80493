"""Drain (what SIGTERM runs): /health and new requests 503 at once; in-flight requests finish
within the timeout, or end with finish_reason "abort" and [DONE] when it runs out."""

from __future__ import annotations

import asyncio
import json

from tests.api.ops_helpers import CHAT, drain_of, serve, wait_until
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings

LONG = {**CHAT, "stream": True, "max_tokens": 200, "ignore_eos": True}


def finish_reasons(body: str) -> list[str]:
    out = []
    for block in body.split("\n\n"):
        if block.startswith("data: {"):
            for choice in json.loads(block[6:]).get("choices", []):
                if choice.get("finish_reason"):
                    out.append(choice["finish_reason"])
    return out


async def test_drain_lets_streams_finish(settings: Settings, fake_engine: FakeEngine) -> None:
    fake_engine.delay_s = 0.005
    async with serve(settings, fake_engine, shutdown_timeout=30) as (app, client):
        drain = drain_of(app)
        streams = [
            asyncio.create_task(client.post("/v1/chat/completions", json=LONG)) for _ in range(3)
        ]
        await wait_until(lambda: fake_engine.health().running >= 3)
        drain.begin()
        health = await client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "draining"
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        await drain.run()
        for r in await asyncio.gather(*streams):
            assert finish_reasons(r.text) == ["length"]
            assert r.text.endswith("data: [DONE]\n\n")
        assert fake_engine.aborted == []


async def test_zero_timeout_aborts(settings: Settings, fake_engine: FakeEngine) -> None:
    fake_engine.delay_s = 0.02
    async with serve(settings, fake_engine, shutdown_timeout=0) as (app, client):
        drain = drain_of(app)
        streams = [
            asyncio.create_task(client.post("/v1/chat/completions", json=LONG)) for _ in range(3)
        ]
        nonstream = asyncio.create_task(
            client.post("/v1/chat/completions", json={**LONG, "stream": False})
        )
        # In the engine, not only admitted: a request the engine never saw gets a 503, no abort.
        await wait_until(lambda: fake_engine.health().running >= 4)
        async with asyncio.timeout(5):
            await drain.run()
        for r in await asyncio.gather(*streams):
            assert finish_reasons(r.text) == ["abort"]
            assert r.text.endswith("data: [DONE]\n\n")
        body = (await nonstream).json()
        assert body["choices"][0]["finish_reason"] == "abort"
        assert drain.admission.in_flight == 0
        assert len(fake_engine.aborted) == 4

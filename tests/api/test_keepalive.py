"""SSE keep-alives: a stream whose first token is late starts at once (role chunk, then
`: keep-alive` comments) instead of holding the response; headers disable proxy buffering."""

from __future__ import annotations

import json
from typing import Any

from tests.api.ops_helpers import CHAT, serve
from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import EngineDeadError

STREAM = {**CHAT, "stream": True, "max_tokens": 3}


def blocks(body: str) -> list[str]:
    return [b for b in body.split("\n\n") if b]


def data(block: str) -> Any:
    payload = block.removeprefix("data: ")
    return payload if payload == "[DONE]" else json.loads(payload)


async def test_keepalive_while_waiting(settings: Settings, fake_engine: FakeEngine) -> None:
    fake_engine.first_token_delay_s = 0.35
    async with serve(settings, fake_engine, sse_keepalive_interval=0.1) as (_, client):
        r = await client.post("/v1/chat/completions", json=STREAM)
        assert r.status_code == 200
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        parts = blocks(r.text)
        assert data(parts[0])["choices"][0]["delta"]["role"] == "assistant"
        keepalives = [i for i, b in enumerate(parts) if b == ": keep-alive"]
        assert len(keepalives) >= 2
        first_token = next(i for i, b in enumerate(parts) if '"content":"' in b and i > 0)
        assert max(keepalives) < first_token  # all while waiting, none once tokens flow
        assert parts[-1] == "data: [DONE]"


async def test_no_keepalive_when_fast_or_off(settings: Settings, fake_engine: FakeEngine) -> None:
    async with serve(settings, fake_engine, sse_keepalive_interval=0.5) as (_, client):
        r = await client.post("/v1/chat/completions", json=STREAM)
        assert ": keep-alive" not in r.text
    fake_engine.first_token_delay_s = 0.2
    async with serve(settings, fake_engine, sse_keepalive_interval=0) as (_, client):
        r = await client.post("/v1/chat/completions", json=STREAM)
        assert ": keep-alive" not in r.text
        assert r.text.endswith("data: [DONE]\n\n")


async def test_late_failure_is_an_error_frame(settings: Settings, fake_engine: FakeEngine) -> None:
    fake_engine.first_token_delay_s = 0.25
    fake_engine.fail_after_tokens = 0
    fake_engine.fail_with = EngineDeadError("gone")
    async with serve(settings, fake_engine, sse_keepalive_interval=0.1) as (_, client):
        r = await client.post(
            "/v1/completions", json={"model": "tiny-model", "prompt": "hi", "stream": True}
        )
        assert r.status_code == 200
        parts = [b for b in blocks(r.text) if not b.startswith(":")]
        assert data(parts[-2])["error"]["code"] == "engine_dead"
        assert parts[-1] == "data: [DONE]"


async def test_early_failure_is_a_status(settings: Settings, fake_engine: FakeEngine) -> None:
    fake_engine.fail_on_generate = EngineDeadError("gone")
    async with serve(settings, fake_engine, sse_keepalive_interval=0.1) as (_, client):
        r = await client.post("/v1/chat/completions", json=STREAM)
        assert r.status_code == 503

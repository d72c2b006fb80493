"""GET /metrics: vLLM-named engine metrics under trtllm_gateway:, HTTP metrics, per-app registry."""

from __future__ import annotations

import httpx
from asgi_lifespan import LifespanManager

from tests.conftest import MODEL, wait_ready
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings

LABEL = f'model_name="{MODEL}"'


async def test_request_metrics(client: httpx.AsyncClient) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
    r = await client.get("/metrics")
    assert r.status_code == 200
    text = r.text
    assert f"trtllm_gateway:time_to_first_token_seconds_count{{{LABEL}}} 1.0" in text
    assert f"trtllm_gateway:e2e_request_latency_seconds_count{{{LABEL}}} 1.0" in text
    assert f"trtllm_gateway:inter_token_latency_seconds_count{{{LABEL}}} 3.0" in text
    assert f"trtllm_gateway:generation_tokens_total{{{LABEL}}} 4.0" in text
    assert f'trtllm_gateway:request_success_total{{finished_reason="length",{LABEL}}} 1.0' in text
    assert f"trtllm_gateway:num_requests_running{{{LABEL}}} 0.0" in text
    assert f"trtllm_gateway:kv_cache_usage_perc{{{LABEL}}} 0.0" in text
    assert "trtllm_gateway:http_requests_client_disconnected_total 0.0" in text
    assert 'http_requests_total{handler="/v1/chat/completions"' in text


async def test_two_apps_do_not_collide(settings: Settings, fake_engine: FakeEngine) -> None:
    first = create_app(settings.parts(), engine=fake_engine)
    second = create_app(settings.parts(), engine=fake_engine)
    async with LifespanManager(second) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await wait_ready(client)
            assert (await client.get("/metrics")).status_code == 200
    assert first is not second

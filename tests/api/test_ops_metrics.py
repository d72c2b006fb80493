"""/metrics for operations: admission gauges, media counters (multimodal.MediaMetrics), the
decoded-pixel budget's gauges, and the remote-prefill counters and KV-transfer histogram (engine
RemotePrefillStats)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from tests.api.ops_helpers import state_of
from tests.conftest import MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.stats import RemotePrefillStats
from trtllm_gateway.multimodal import MediaBusyError
from trtllm_gateway.web.shared_counts import SharedCounts

LABEL = f'model_name="{MODEL}"'


async def test_admission_and_media(client: httpx.AsyncClient, app: FastAPI) -> None:
    media = state_of(app).metrics.media
    media.record("http", "ok", 1234)
    media.record("data", "rejected")
    media.cache_hits += 2
    text = (await client.get("/metrics")).text
    assert "trtllm_gateway:num_requests_in_flight 0.0" in text
    assert 'trtllm_gateway:admission_rejected_total{reason="queue_full"} 0.0' in text
    assert 'trtllm_gateway:media_fetches_total{outcome="ok",source="http"} 1.0' in text
    assert 'trtllm_gateway:media_fetches_total{outcome="rejected",source="data"} 1.0' in text
    assert 'trtllm_gateway:media_bytes_loaded_total{source="http"} 1234.0' in text
    assert "trtllm_gateway:media_cache_hits_total 2.0" in text
    assert "trtllm_gateway:remote_prefill_total" not in text  # not a decode instance


async def test_image_pixel_gauges(client: httpx.AsyncClient, app: FastAPI) -> None:
    metrics = state_of(app).metrics
    assert metrics.pixels.capacity == 2 * 40_000_000  # unset: two of the largest images
    lease = metrics.pixels.lease()
    await lease.acquire(3_000_000, 1.0)
    slot = metrics.admission.reserve(1)
    slot.on_release(lease.release)  # as the chat route ties the two: one end for both
    text = (await client.get("/metrics")).text
    assert "trtllm_gateway:image_pixels_in_flight 3e+06" in text
    assert "trtllm_gateway:image_requests_waiting 0.0" in text
    slot.release()
    text = (await client.get("/metrics")).text
    assert "trtllm_gateway:image_pixels_in_flight 0.0" in text
    assert "trtllm_gateway:image_pixels_in_flight_peak 3e+06" in text


async def test_remote_prefill(client: httpx.AsyncClient, app: FastAPI) -> None:
    stats = RemotePrefillStats()
    state_of(app).metrics.bind_remote_prefill(stats)
    stats.record("remote")
    stats.record("remote")
    stats.record("local_short")
    stats.observe_transfer(4096, 0.02)
    stats.siblings_healthy["http://p1:8000"] = True
    stats.siblings_healthy["http://p2:8000"] = False
    text = (await client.get("/metrics")).text
    assert f'trtllm_gateway:remote_prefill_total{{{LABEL},outcome="remote"}} 2.0' in text
    assert f'trtllm_gateway:remote_prefill_total{{{LABEL},outcome="failed"}} 0.0' in text
    assert f"trtllm_gateway:kv_transfer_bytes_total{{{LABEL}}} 4096.0" in text
    assert f'trtllm_gateway:kv_transfer_seconds_bucket{{le="0.025",{LABEL}}} 1.0' in text
    assert 'trtllm_gateway:sibling_healthy{sibling="http://p2:8000"} 0.0' in text
    stats.observe_transfer(10, 0.5)
    text = (await client.get("/metrics")).text
    assert f"trtllm_gateway:kv_transfer_seconds_count{{{LABEL}}} 2.0" in text
    assert stats.kv_seconds == []


def _gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in /metrics")


async def test_api_servers_share_the_pixel_budget(
    settings: Settings, fake_engine: FakeEngine, tmp_path: Path
) -> None:
    """--api-server-count 2 (two apps on one counts file, as the supervisor runs them): pixels
    one server holds count against the other's budget and show in its gauges."""
    counts = str(tmp_path / "admission")
    SharedCounts.create(counts, servers=2)
    other = FakeEngine(fake_engine.info, fake_engine.script)
    one = create_app(settings.parts(), engine=fake_engine, shared=SharedCounts(counts))
    two = create_app(settings.parts(), engine=other, shared=SharedCounts(counts))
    async with LifespanManager(one), LifespanManager(two) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            budget, budget2 = state_of(one).metrics.pixels, state_of(two).metrics.pixels
            held = budget.lease()
            await held.acquire(budget.capacity - 1_000_000, 1.0)
            text = (await client.get("/metrics")).text
            in_flight = _gauge(text, "trtllm_gateway:image_pixels_in_flight")
            assert in_flight == budget.capacity - 1_000_000
            with pytest.raises(MediaBusyError):  # the other server's room is gone too
                await budget2.lease().acquire(2_000_000, 0.05)
            held.release()
            late = budget2.lease()
            await late.acquire(2_000_000, 1.0)
            text = (await client.get("/metrics")).text
            assert _gauge(text, "trtllm_gateway:image_pixels_in_flight") == 2_000_000
            late.release()

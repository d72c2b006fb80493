"""EngineExtras: a wrapper forwards its inner engine's extras by construction, and the lifespan
binds what they hold (a decode instance with both --prefill-url and --encode-url keeps its
remote-encode metrics, which reading the wrapper's attributes with getattr lost)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager

from tests.conftest import wait_ready
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.capabilities import EngineExtras
from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
from trtllm_gateway.engine.protocol import EngineInfo
from trtllm_gateway.engine.stats import RemotePrefillStats


class EncodingFakeEngine(FakeEngine):
    """A FakeEngine that, like the built-in one with --encode-url, counts remote encodes."""

    encoded: Counter[str]

    @property
    def extras(self) -> EngineExtras:
        return EngineExtras(self.tokenizer_dir, remote_encode=self.encoded)


def _sibling() -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/internal/v1/info":
            info = {"protocol_version": 1, "model": "tiny-model", "kv_layout": ""}
            return httpx.Response(200, json=info)
        return httpx.Response(404)

    return httpx.MockTransport(handler)


def _decode(settings: Settings) -> GatewayConfig:
    return settings.model_copy(update={"mode": "decode", "prefill_url": ["http://p1"]}).parts()


def _wrapped(settings: Settings, info: EngineInfo, tokenizer_dir: Path) -> RemotePrefillEngine:
    inner = EncodingFakeEngine(info, [5], tokenizer_dir=tokenizer_dir)
    inner.encoded = Counter(remote=2)
    disagg = _decode(settings).disagg
    return RemotePrefillEngine(inner, disagg, RemotePrefillStats(), transport=_sibling())


def test_remote_prefill_engine_forwards_the_inner_extras(
    settings: Settings, engine_info: EngineInfo, tokenizer_dir: Path
) -> None:
    engine = _wrapped(settings, engine_info, tokenizer_dir)
    extras = engine.extras
    assert extras.tokenizer_dir == tokenizer_dir
    assert extras.remote_encode is engine.inner.extras.remote_encode  # live, not a copy
    assert extras.remote_prefill is engine.remote_prefill_stats
    assert extras.kv_routing is None  # no --kv-routing: no followers


async def test_lifespan_binds_remote_prefill_and_remote_encode_metrics(
    settings: Settings, engine_info: EngineInfo, tokenizer_dir: Path
) -> None:
    engine = _wrapped(settings, engine_info, tokenizer_dir)
    app = create_app(_decode(settings), engine=engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await wait_ready(client)
            text = (await client.get("/metrics")).text
    label = 'model_name="tiny-model"'
    assert f'trtllm_gateway:remote_encode_total{{{label},outcome="remote"}} 2.0' in text
    assert f'trtllm_gateway:remote_prefill_total{{{label},outcome="remote"}} 0.0' in text

"""A stopped app keeps no reference to its engine. FastAPI caches the /metrics endpoint's function
process-wide (fastapi/dependencies/models.py, _is_async_gen_callable_cached), so whatever the
metrics refer to outlives the app: before GatewayMetrics.unbind_engine, every app of a test
session kept its stopped engine (a built-in engine's model and KV, 2-3 GiB on CPU), and one CI run
was killed at 18 GiB."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import httpx
from asgi_lifespan import LifespanManager

from tests.conftest import wait_ready
from tests.fake_engine import FakeEngine
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import EngineInfo


async def test_a_stopped_app_lets_its_engine_go(
    settings: Settings, engine_info: EngineInfo, reply_ids: list[int], tokenizer_dir: Path
) -> None:
    engine = FakeEngine(engine_info, reply_ids, tokenizer_dir=tokenizer_dir)
    gone = weakref.ref(engine)
    app = create_app(settings.parts(), engine=engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await wait_ready(client)
            assert "trtllm_gateway:" in (await client.get("/metrics")).text  # the path is cached
    del app, manager, transport, client, engine
    gc.collect()
    assert gone() is None

"""Protocol v2 end to end with the real default model, in one process: a prefill gateway (its real
/internal/ routes over a built-in engine core) reached through httpx's ASGI transport by a decode
instance's RemotePrefillEngine over another core. Each transport a CPU host has (shm: the probe
token is found in the sibling's arena; the http stream; one NIXL READ, asked for or picked by
auto for a sibling on another host; v1 for a sibling without version 2) against the decode
engine's aggregated greedy tokens. Real processes: tests/e2e/test_disagg.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import uvicorn
from asgi_lifespan import LifespanManager
from pydantic import SecretStr

from tests.configs import builtin_config, gateway
from tests.conftest import wait_ready
from tests.engine.conftest import collect, greedy
from trtllm_gateway.app.main import create_app
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
from trtllm_gateway.engine.kv_region import HostArenas
from trtllm_gateway.engine.protocol import GenerateRequest, TokenEvent
from trtllm_gateway.engine.stats import RemotePrefillStats

KEY = SecretStr("sib-key")
FIELDS: dict[str, Any] = {"dtype": "float32", "device": "cpu", "block_size": 8}


@pytest.fixture
async def prefill_app() -> AsyncIterator[Any]:
    config = gateway(mode="prefill", internal_api_key=KEY, **FIELDS)
    engine = core_client(builtin_config(mode="prefill", **FIELDS), in_thread=True)
    app = create_app(config, engine=engine)
    async with LifespanManager(app, startup_timeout=600) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://prefill") as client:
            await wait_ready(client, timeout_s=600)
        yield manager.app


def _tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


@pytest.mark.parametrize(
    ("want", "got"),
    [("auto", "shm"), ("http", "http"), ("auto", "v1"), ("nixl", "nixl"), ("auto-far", "nixl")],
)
async def test_v2_transports_equal_aggregated(
    prefill_app: Any,
    chat_prompts: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
    want: str,
    got: str,
) -> None:
    if got == "v1":  # a sibling from before version 2: its /info announces only version 1
        monkeypatch.setattr(wire, "PROTOCOL_VERSIONS", (1,))
    if want == "auto-far":  # the sibling's arena not visible here: another host, as auto sees it
        monkeypatch.setattr(HostArenas, "token", lambda self, name: b"")
        want = "auto"
    url, transport, served = "http://prefill", httpx.ASGITransport(app=prefill_app), None
    if want == "http":  # the KV stream is read with http.client off the loop: a real socket
        served = await _serve(prefill_app)
        url, transport = served[0], None
    inner = core_client(builtin_config(mode="decode", **FIELDS), in_thread=True)
    disagg = gateway(
        mode="decode",
        prefill_url=[url],
        internal_api_key=KEY,
        max_local_prefill_tokens=0,
        kv_transport=want,
    ).disagg
    stats = RemotePrefillStats()
    engine = RemotePrefillEngine(inner, disagg, stats, transport=transport)
    await engine.start()  # starts the decode core, checks the sibling and picks a transport
    try:
        assert engine._transports[url] == got
        landed: list[str] = []
        place = engine.fetch.receive.place

        def spy(rid: str, region: Any) -> Any:
            spot = place(rid, region)
            landed.append(rid if spot is not None else "")
            return spot

        engine.fetch.receive.place = spy  # type: ignore[method-assign]
        for i, ids in enumerate(chat_prompts[:2]):
            req = GenerateRequest(f"v{i}", tuple(ids), greedy(16, logprobs=1))
            expected = await collect(inner, replace(req, request_id=f"agg{i}"))
            events = [ev async for ev in engine.generate(replace(req, request_id=f"r{i}"))]
            assert _tokens(events) == _tokens(expected)
        assert stats.outcomes["remote"] == 2 and stats.kv_bytes > 0, stats
        if got in ("http", "nixl"):  # it landed in the receive arena, each region freed
            assert landed == ["r0", "r1"]
            arena = engine.fetch.receive._arena
            assert arena is not None and arena.alloc.owners() == []
        if got == "nixl":  # read by the decode side's agent from the prefill side's arena
            assert len(engine.fetch._nixl._remotes) == 1
        # Each core clocks its step thread's hand-off work; the prefill side's reaches /metrics.
        health = inner.health()
        assert health.kv_handoffs == 2 and health.kv_handoff_step_seconds > 0, health
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=prefill_app), base_url="http://prefill"
        ) as client:
            text = (await client.get("/metrics")).text
        assert _sample(text, "trtllm_gateway:kv_handoffs_total") == 2
        assert _sample(text, "trtllm_gateway:kv_handoff_step_seconds_total") > 0
    finally:
        await engine.stop()
        if served is not None:
            served[1].should_exit = True
            await served[2]


def _sample(text: str, name: str) -> float:
    """The one sample of a series in a /metrics text."""
    (value,) = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name)]
    return value


async def _serve(app: Any) -> tuple[str, Any, asyncio.Task[None]]:
    """app (its lifespan already running) on a loopback port, in this event loop."""
    server = uvicorn.Server(uvicorn.Config(app, port=0, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn offers no event to wait on)
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}", server, task

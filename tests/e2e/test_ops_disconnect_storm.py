"""Disconnect storm (vLLM's test_request_cancellation): 200 streaming requests with long outputs
and 0.5 s client timeouts, in waves of 50 so that most reach the engine before their client
leaves; then a fresh request completes in under 5 s, and /metrics shows engine aborts, no running
request, no KV usage and nothing left in flight."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from tests.e2e.ops_client import chat
from tests.e2e.server import Server

STORM = 200
WAVE = 50
CLIENT_TIMEOUT_S = 0.5
ABORTS = 'finished_reason="abort"'


async def _abandoned(client: httpx.AsyncClient, url: str) -> None:
    with contextlib.suppress(TimeoutError, httpx.HTTPError):
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            body = chat(2000)
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_bytes():
                    pass


def _idle(server: Server) -> dict[str, float]:
    names = (
        "trtllm_gateway:num_requests_running",
        "trtllm_gateway:num_requests_waiting",
        "trtllm_gateway:kv_cache_usage_perc",
        "trtllm_gateway:num_requests_in_flight",
    )
    return {name: server.metric(name) for name in names}


async def test_disconnect_storm(server: Server) -> None:
    before = server.metric("trtllm_gateway:http_requests_client_disconnected_total")
    aborts_before = _aborts(server)
    limits = httpx.Limits(max_connections=WAVE + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        for _ in range(STORM // WAVE):
            await asyncio.gather(*(_abandoned(client, server.url) for _ in range(WAVE)))
        t0 = time.monotonic()
        r = await client.post(
            f"{server.url}/v1/chat/completions", json=chat(8, stream=False), timeout=5
        )
        elapsed = time.monotonic() - t0
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert elapsed < 5, elapsed
    deadline = time.monotonic() + 5
    while any((values := _idle(server)).values()) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    assert not any(values.values()), values
    after = server.metric("trtllm_gateway:http_requests_client_disconnected_total")
    # A client that gave up before its request reached a handler (a loaded CI box) is not counted.
    assert 0 < after - before <= STORM
    assert _aborts(server) - aborts_before > 0  # the engine saw them, and aborted them


def _aborts(server: Server) -> float:
    try:
        return server.metric("trtllm_gateway:request_success_total", ABORTS)
    except KeyError:
        return 0.0

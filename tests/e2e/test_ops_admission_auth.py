"""One real process with --api-key and --max-batch-size 2 --max-queued-requests 2: a burst gets
503s with Retry-After while every accepted request completes and the counters return to zero;
missing or wrong keys get 401, the right key 200, /health and /metrics stay open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.ops_client import chat, stream_chat
from tests.e2e.server import Server

KEY = "sk-e2e-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
BURST = 12


@pytest.fixture(scope="module")
def ops_server(log_dir: Path) -> Iterator[Server]:
    args = ["--num-kv-blocks", "256", "--max-batch-size", "2", "--max-queued-requests", "2"]
    srv = Server(args=args, env={"GATEWAY_API_KEY": KEY}).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()
    assert KEY not in srv.log()


def _wait_zero(srv: Server, timeout: float = 10.0) -> None:
    names = (
        "trtllm_gateway:num_requests_in_flight",
        "trtllm_gateway:num_requests_running",
        "trtllm_gateway:num_requests_waiting",
        "trtllm_gateway:kv_cache_usage_perc",
    )
    deadline = time.monotonic() + timeout
    while True:
        values = {n: srv.metric(n) for n in names}
        if not any(values.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle: {values}")
        time.sleep(0.1)


async def test_burst_gets_503_and_accepted_complete(ops_server: Server) -> None:
    limits = httpx.Limits(max_connections=BURST + 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        results = await asyncio.gather(
            *(stream_chat(client, ops_server.url, chat(24), headers=AUTH) for _ in range(BURST))
        )
    accepted = [r for r in results if r.status == 200]
    refused = [r for r in results if r.status == 503]
    assert len(accepted) + len(refused) == BURST
    assert 4 <= len(accepted) < BURST
    for r in accepted:
        assert r.finish_reasons == ["length"]
        assert r.done
    for r in refused:
        assert r.retry_after == "1"
        assert r.error["error"]["code"] == "queue_full"
    _wait_zero(ops_server)
    rejected = ops_server.metric("trtllm_gateway:admission_rejected_total", 'reason="queue_full"')
    assert rejected >= len(refused)


def test_auth(ops_server: Server) -> None:
    url = ops_server.url
    body = chat(2, stream=False)
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 401
    wrong = {"Authorization": "Bearer sk-wrong"}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=wrong)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "AuthenticationError"
    assert httpx.get(f"{url}/v1/models").status_code == 401
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 200

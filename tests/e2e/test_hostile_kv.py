"""Held KV under attack (issue 24, item 1) on SmolLM2, beside victims that must keep their answers.

A prefill instance holds a context phase's KV for a sibling to pull. Before the fix a second
/internal/v1/prefill under one request_id overwrote the hand-off and orphaned its blocks for good;
a request that then needed more blocks than were free made the core loop spin (an empty batch a
turn) and the gateway's reader starve the event loop: /health stopped answering. Here: a duplicate
id is a 400 and frees nothing it should not, held KV has a bound (503 past it) and an expiry, and a
request waiting for blocks leaves /health answering at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.ops_client import INTERNAL_AUTH, INTERNAL_KEY, MODEL
from tests.e2e.server import Server
from tests.e2e.victims import alone, victims
from trtllm_gateway.engine.disagg import kv_wire

BLOCKS = 64  # x 16 tokens; held hand-offs may take half (--max-held-kv-fraction 0.5)
# Since issue 41 a finished context phase's KV is staged into the transfer arena and its blocks
# freed at once; the arena is the bound on what waits for siblings: 24 MiB holds one 300-token
# prompt's float32 KV (46,080 bytes a token: 13.8 MB) and the 490-token one, not two of 300.
STAGING_MB = 24
EXPIRY_S = 300.0  # no hand-off expires mid-test (expiry: tests/unit/test_stepper_handoffs.py)


@pytest.fixture(scope="module")
def kv_server(log_dir: Path) -> Iterator[Server]:
    args = ["--num-kv-blocks", str(BLOCKS), "--kv-handoff-timeout", str(EXPIRY_S)]
    args += ["--kv-staging-mb", str(STAGING_MB)]
    srv = Server(args=[*args, "--internal-api-key", INTERNAL_KEY]).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def prefill_body(request_id: str, n: int, first: int = 1000) -> dict[str, Any]:
    return {"request_id": request_id, "prompt_token_ids": list(range(first, first + n))}


async def blocks_used(client: httpx.AsyncClient, url: str) -> int:
    r = await client.get(f"{url}/internal/v1/load")
    assert r.status_code == 200, r.text
    return int(r.json()["kv_blocks_used"])


async def settled_blocks(client: httpx.AsyncClient, url: str, want: int) -> int:
    """blocks_used once it reads `want`, or what it reads after 10 s. The gateway's view of the
    core's KV comes with the core's next batch (a release is a message, answered at once), so a
    read right after a release or a finished request may be one batch old."""
    used = await blocks_used(client, url)
    for _ in range(200):
        if used == want:
            break
        await asyncio.sleep(0.05)
        used = await blocks_used(client, url)
    return used


async def health_latency(client: httpx.AsyncClient, url: str) -> float:
    t0 = time.monotonic()
    r = await client.get(f"{url}/health", timeout=30)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


async def test_a_duplicate_prefill_id_is_refused_and_leaks_nothing(kv_server: Server) -> None:
    url = kv_server.url
    async with httpx.AsyncClient(timeout=120, headers=INTERNAL_AUTH) as client:
        expected = await alone(client, url)
        first = await client.post(f"{url}/internal/v1/prefill", json=prefill_body("dup", 100))
        assert first.status_code == 200, first.text
        assert await settled_blocks(client, url, 0) == 0  # staged: the blocks are free again
        beside = asyncio.create_task(victims(client, url))
        for _ in range(2):
            again = prefill_body("dup", 100, first=2000)
            r = await client.post(f"{url}/internal/v1/prefill", json=again)
            assert r.status_code == 400, r.text
            assert "dup" in r.json()["error"]["message"]
        assert await beside == expected
        assert await settled_blocks(client, url, 0) == 0  # the refusals held nothing
        pulled = await client.get(f"{url}/internal/v1/kv/dup")  # the first hand-off is whole
        assert pulled.status_code == 200, pulled.text
        header, _ = kv_wire.decode(pulled.content)
        assert header.num_tokens == 100
        r = await client.delete(f"{url}/internal/v1/kv/dup")
        assert r.status_code == 200, r.text
        pulled = await client.get(f"{url}/internal/v1/kv/dup")
        assert pulled.status_code == 404, pulled.text  # pulled, then released: gone


async def test_held_kv_has_a_bound(kv_server: Server) -> None:
    url = kv_server.url
    async with httpx.AsyncClient(timeout=120, headers=INTERNAL_AUTH) as client:
        a = await client.post(f"{url}/internal/v1/prefill", json=prefill_body("bound-a", 300))
        assert a.status_code == 200, a.text  # 13.8 MB of the 24 MiB staging arena
        b = await client.post(f"{url}/internal/v1/prefill", json=prefill_body("bound-b", 300))
        assert b.status_code == 503, b.text
        assert "arena is full" in b.json()["error"]["message"]
        await client.delete(f"{url}/internal/v1/kv/bound-a")
        c = await client.post(f"{url}/internal/v1/prefill", json=prefill_body("bound-c", 300))
        assert c.status_code == 200, c.text  # released: room again
        await client.delete(f"{url}/internal/v1/kv/bound-c")
        assert await settled_blocks(client, url, 0) == 0


async def test_a_request_waiting_for_held_blocks_starves_nobody(kv_server: Server) -> None:
    """31 blocks held; a 560-token prompt (35 blocks) waits for them. /health answers meanwhile;
    once the hand-off is released the waiting request and the victims behind it all finish."""
    url = kv_server.url
    async with httpx.AsyncClient(timeout=120, headers=INTERNAL_AUTH) as client:
        expected = await alone(client, url)
        held = await client.post(f"{url}/internal/v1/prefill", json=prefill_body("stall", 490))
        assert held.status_code == 200, held.text
        big = {"model": MODEL, "prompt": list(range(3000, 3560)), "max_tokens": 4, "temperature": 0}
        waiting = asyncio.create_task(client.post(f"{url}/v1/completions", json=big))
        beside = asyncio.create_task(victims(client, url))
        await asyncio.sleep(0.5)
        latencies = [await health_latency(client, url) for _ in range(5)]
        assert not waiting.done(), "the big prompt should wait for the held blocks"
        assert max(latencies) < 1.0, latencies
        released = await client.delete(f"{url}/internal/v1/kv/stall")
        assert released.status_code == 200, released.text
        r = await waiting
        assert r.status_code == 200, r.text
        assert await beside == expected
        assert await settled_blocks(client, url, 0) == 0

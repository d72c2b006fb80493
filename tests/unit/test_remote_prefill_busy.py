"""Issue 41 item 5 through RemotePrefillEngine against scripted siblings (httpx.MockTransport):
a busy sibling (503 + its queue) is retried, passed over for another, or the prompt prefilled
locally by policy, and never marked unhealthy; a connection failure still is; KV room is
reserved here before a prompt is sent; the hand-off lease is renewed while the pull waits."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np

from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.disagg import kv_wire
from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
from trtllm_gateway.engine.kv_region import KvRegion
from trtllm_gateway.engine.protocol import EngineHealth, EngineInfo, GenerateRequest, SamplingParams
from trtllm_gateway.engine.stats import RemotePrefillStats

LAYOUT = "llama:2x1x4:torch.float32:bs16"
INFO = EngineInfo(
    model_id="m", max_model_len=512, vocab_size=100, eos_token_ids=(), kv_layout=LAYOUT
)
PROMPT = tuple(range(1, 41))  # 40 tokens: 3 blocks of 16, with the first tokens
ANSWER = {
    "first_token_ids": [7],
    "disaggregated_params": {
        "ctx_request_id": "r",
        "opaque_state": base64.b64encode(b"s").decode(),
    },
}


def kv_blob() -> bytes:
    shape = (2, 2, len(PROMPT), 1, 4)
    header = {"kv_layout": LAYOUT, "dtype": "torch.float32", "shape": shape, "block_size": 16}
    return kv_wire.encode(
        {**header, "num_tokens": len(PROMPT)}, np.zeros(shape, np.float32).tobytes()
    )


class HandoffEngine(FakeEngine):
    """A FakeEngine that takes a sibling's KV (KvHandoff) and reports its KV blocks."""

    total_blocks = 64
    active_blocks = 0

    async def pull_kv(self, ctx_request_id: str) -> bytes:
        raise NotImplementedError

    async def stage_kv(self, ctx_request_id: str) -> KvRegion:
        raise NotImplementedError

    def kv_view(self, region: KvRegion) -> memoryview:
        raise NotImplementedError

    def kv_arena(self, name: str) -> memoryview:
        raise NotImplementedError

    def release_kv(self, ctx_request_id: str) -> None:
        pass

    def renew_kv(self, ctx_request_id: str) -> None:
        pass

    def cached_prefix_tokens(self, prompt_token_ids: tuple[int, ...]) -> int:
        return 0

    def health(self) -> EngineHealth:
        return EngineHealth(
            "ready", kv_total_blocks=self.total_blocks, kv_active_blocks=self.active_blocks
        )


Prefill = Callable[[int], httpx.Response]  # the nth POST /prefill to this sibling -> answer


def busy(requests: int | None = 4, tokens: int | None = 160) -> httpx.Response:
    headers = {"Retry-After": "1", **wire.QueueReport(requests, tokens).headers()}
    error = {"error": {"message": "prefill queue full", "code": "prefill_queue_full"}}
    return httpx.Response(503, json=error, headers=headers)


def ok(lease_s: float = 0.0) -> httpx.Response:
    return httpx.Response(200, json={**ANSWER, "lease_s": lease_s})


class Siblings:
    """Scripted siblings by host; `seen` records every call as 'host METHOD path'."""

    def __init__(self, prefill: dict[str, Prefill], kv_delay: float = 0.0) -> None:
        self.prefill = prefill
        self.kv_delay = kv_delay
        self.seen: list[str] = []
        self.posts: dict[str, int] = dict.fromkeys(prefill, 0)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.seen.append(f"{host} {request.method} {path}")
        if path == wire.INFO_PATH:
            return httpx.Response(
                200, json={"protocol_version": 1, "model": "m", "kv_layout": LAYOUT}
            )
        if path == "/health":
            return httpx.Response(200, json={"status": "ready"})
        if path == wire.PREFILL_PATH:
            self.posts[host] += 1
            return self.prefill[host](self.posts[host])
        if path == wire.kv_path("r") and request.method == "GET":
            await asyncio.sleep(self.kv_delay)
            return httpx.Response(200, content=kv_blob())
        if path == wire.lease_path("r"):
            return httpx.Response(200, json={"lease_s": 1.0})
        return httpx.Response(404)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


async def run(
    sibs: Siblings, inner: HandoffEngine | None = None, **settings: Any
) -> tuple[HandoffEngine, RemotePrefillStats]:
    urls = [f"http://{host}" for host in sibs.prefill]
    config = Settings(
        mode="decode", prefill_url=urls, max_local_prefill_tokens=0, kv_routing=False, **settings
    ).parts()
    inner = inner or HandoffEngine(INFO, [5, 6])
    stats = RemotePrefillStats()
    engine = RemotePrefillEngine(inner, config.disagg, stats, transport=sibs.transport())
    await engine.start()
    try:
        req = GenerateRequest("r", PROMPT, SamplingParams(max_tokens=2))
        events = [ev async for ev in engine.generate(req)]
        assert events[-1].finish_reason is not None
        assert engine.room.reserved == 0  # every reservation ended with its request
        return inner, stats
    finally:
        await engine.stop()


async def test_a_busy_sibling_is_retried_and_then_serves() -> None:
    sibs = Siblings({"p1": lambda n: busy() if n <= 2 else ok()})
    inner, stats = await run(sibs)
    assert sibs.posts == {"p1": 3}
    assert stats.outcomes == {"remote_retried": 1}
    assert stats.busy_answers == {"http://p1": 2}
    assert stats.siblings_healthy == {"http://p1": True}
    assert inner.requests[-1].disagg is not None and inner.requests[-1].disagg.kv_payload


async def test_a_busy_sibling_is_passed_over_for_another_at_once() -> None:
    sibs = Siblings({"p1": lambda n: busy(), "p2": lambda n: ok()})
    _, stats = await run(sibs)
    # Whichever was asked first, p2 served it, with no wait and nobody marked.
    assert sibs.posts["p2"] == 1 and sibs.posts["p1"] <= 1
    assert stats.outcomes["remote"] + stats.outcomes["remote_retried"] == 1
    assert all(stats.siblings_healthy.get(u) is not False for u in ("http://p1", "http://p2"))


async def test_a_long_queue_sends_the_prompt_local_by_policy() -> None:
    """160 queued tokens > 2 x 40 uncached: waiting costs more than prefilling here."""
    sibs = Siblings({"p1": lambda n: busy(tokens=160), "p2": lambda n: busy(tokens=400)})
    inner, stats = await run(sibs, busy_local_factor=2.0)
    assert sibs.posts == {"p1": 1, "p2": 1}  # each asked once, no retry round
    assert stats.outcomes == {"local_busy": 1}
    assert inner.requests[-1].disagg is None
    assert stats.siblings_healthy.get("http://p1") is not False
    assert stats.siblings_healthy.get("http://p2") is not False


async def test_the_same_queue_is_waited_for_under_a_higher_factor() -> None:
    sibs = Siblings({"p1": lambda n: busy(tokens=160) if n == 1 else ok()})
    _, stats = await run(sibs, busy_local_factor=8.0)
    assert stats.outcomes == {"remote_retried": 1}


async def test_only_connection_failures_mark_a_sibling() -> None:
    def refuse(n: int) -> httpx.Response:
        raise httpx.ConnectError("refused")

    sibs = Siblings({"p1": refuse})
    _, stats = await run(sibs)
    assert stats.outcomes == {"local_fallback": 1}
    assert stats.siblings_healthy == {"http://p1": False}


async def test_no_room_here_means_no_prompt_is_sent() -> None:
    """The decode side reserves blocks for the prompt and its first tokens before it asks; with
    none free in time the prompt is prefilled here (the engine queues it) and no sibling
    computes KV that would wait, held, for room."""
    inner = HandoffEngine(INFO, [5, 6])
    inner.active_blocks = inner.total_blocks - 2  # 2 free, 3 needed
    sibs = Siblings({"p1": lambda n: ok()})
    _, stats = await run(sibs, inner, remote_prefill_timeout=0.3)
    assert sibs.posts == {"p1": 0}
    assert stats.outcomes == {"local_no_room": 1}


async def test_room_freed_while_waiting_lets_the_prompt_go_remote() -> None:
    inner = HandoffEngine(INFO, [5, 6])
    inner.active_blocks = inner.total_blocks  # full now

    async def free_later() -> None:
        await asyncio.sleep(0.2)
        inner.active_blocks = 0

    sibs = Siblings({"p1": lambda n: ok()})
    freeing = asyncio.create_task(free_later())
    _, stats = await run(sibs, inner, remote_prefill_timeout=5.0)
    await freeing
    assert stats.outcomes == {"remote": 1}


async def test_the_lease_is_renewed_while_the_pull_waits() -> None:
    """lease_s 0.3: a pull that takes 0.5 s renews it about every 0.1 s."""
    sibs = Siblings({"p1": lambda n: ok(lease_s=0.3)}, kv_delay=0.5)
    _, stats = await run(sibs)
    renewals = sibs.seen.count(f"p1 POST {wire.lease_path('r')}")
    assert renewals >= 3 and stats.lease_renewals == renewals
    assert stats.outcomes == {"remote": 1}
    # A sibling that names no lease (an older one) is not renewed.
    sibs = Siblings({"p1": lambda n: ok(lease_s=0.0)}, kv_delay=0.3)
    _, stats = await run(sibs)
    assert stats.lease_renewals == 0 and not any("lease" in s for s in sibs.seen)


async def test_an_expired_hand_off_is_a_lost_prompt_not_a_dead_sibling() -> None:
    sibs = Siblings({"p1": lambda n: ok()})
    original = sibs.handle

    async def expired(request: httpx.Request) -> httpx.Response:
        if request.url.path == wire.kv_path("r"):
            return httpx.Response(404, json={"error": {"message": "no KV held"}})
        return await original(request)

    sibs.handle = expired  # type: ignore[method-assign]
    _, stats = await run(sibs)
    assert stats.outcomes == {"local_fallback": 1}
    assert stats.siblings_healthy.get("http://p1") is not False


class SettlingEngine(HandoffEngine):
    """Says when an aborted request is settled (capabilities.AbortSettling) only when told."""

    def __init__(self) -> None:
        super().__init__(INFO, [5, 6], first_token_delay_s=30.0)
        self.waiting: dict[str, Callable[[], None]] = {}

    def when_settled(self, request_id: str, fn: Callable[[], None]) -> None:
        self.waiting[request_id] = fn


async def test_a_client_gone_before_the_first_event_frees_the_copy_regions_once_settled() -> None:
    """The core may still copy the prompt's KV from the receive arena (or a sibling's staged
    region) after the client went away: remote_prefill frees the region on the core's last word
    on the request, not when the stream closes."""
    sibs = Siblings({"p1": lambda n: ok()})
    config = Settings(
        mode="decode", prefill_url=["http://p1"], max_local_prefill_tokens=0, kv_routing=False
    ).parts()
    inner = SettlingEngine()
    engine = RemotePrefillEngine(
        inner, config.disagg, RemotePrefillStats(), transport=sibs.transport()
    )
    await engine.start()
    freed: list[str] = []
    engine.fetch.receive.free = freed.append  # type: ignore[method-assign]
    try:
        gen = engine.generate(GenerateRequest("r", PROMPT, SamplingParams(max_tokens=2)))
        first = asyncio.ensure_future(gen.__anext__())
        for _ in range(200):  # the sibling answered and the core has the request
            if "p1 POST " + wire.PREFILL_PATH in sibs.seen and not first.done():
                await asyncio.sleep(0.05)
                break
            await asyncio.sleep(0.01)
        first.cancel()  # the client is gone before the first event
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await gen.aclose()
        assert freed == [] and list(inner.waiting) == ["r"]
        inner.waiting.pop("r")()  # the core's last word on it
        assert freed == ["r"]
    finally:
        await engine.stop()

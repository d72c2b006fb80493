"""A prefill sibling that holds the internal key but answers badly (issue 40, item 6): the
decode side caps the KV pull at the prompt's size in its layout, gives each call one deadline
for the whole exchange (a byte every few seconds no longer resets it), refuses KV that is not
finite or not the prompt's shape, and first token ids out of the vocabulary; each is a sibling
fault: the request prefills locally, it is never a client error. Scripted siblings
(httpx.MockTransport) in front of a FakeEngine that takes KV (KvHandoff)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import pytest

from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.disagg import kv_check, kv_wire
from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine
from trtllm_gateway.engine.kv_region import KvRegion
from trtllm_gateway.engine.protocol import EngineInfo, GenerateRequest, SamplingParams
from trtllm_gateway.engine.stats import RemotePrefillStats

LAYOUT = "llama:2x1x4:torch.float32:bs16"
INFO = EngineInfo(
    model_id="m", max_model_len=512, vocab_size=100, eos_token_ids=(), kv_layout=LAYOUT
)
PROMPT = tuple(range(1, 41))


class HandoffEngine(FakeEngine):
    """A FakeEngine that takes a sibling's KV, as the built-in engine does (KvHandoff)."""

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


def blob(tokens: int = len(PROMPT), fill: float = 0.5, shape: Any = None) -> bytes:
    shape = shape or (2, 2, tokens, 1, 4)
    data = np.full(shape, fill, dtype=np.float32).tobytes()
    header = {
        "kv_layout": LAYOUT,
        "dtype": "torch.float32",
        "shape": shape,
        "block_size": 16,
        "num_tokens": tokens,
    }
    return kv_wire.encode(header, data)


PREFILL_ANSWER = {
    "first_token_ids": [7],
    "disaggregated_params": {
        "ctx_request_id": "r",
        "opaque_state": base64.b64encode(b"state").decode(),
    },
}


def sibling(
    kv: Callable[[], httpx.Response],
    answer: dict[str, Any] = PREFILL_ANSWER,
    health: int = 200,
) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(health, json={"status": "ready"})
        if path == "/internal/v1/info":
            return httpx.Response(
                200, json={"protocol_version": 1, "model": "m", "kv_layout": LAYOUT}
            )
        if path == "/internal/v1/prefill":
            return httpx.Response(200, json=answer)
        if path == "/internal/v1/kv/r" and request.method == "GET":
            return kv()
        return httpx.Response(200, json={})

    return httpx.MockTransport(handler)


async def run(
    transport: httpx.MockTransport, **settings: Any
) -> tuple[HandoffEngine, RemotePrefillStats, float]:
    stats = RemotePrefillStats()
    s = Settings(
        mode="decode", prefill_url=["http://p1"], max_local_prefill_tokens=0, **settings
    ).parts()
    inner = HandoffEngine(INFO, [5, 6])
    engine = RemotePrefillEngine(inner, s.disagg, stats, transport=transport)
    await engine.start()
    t0 = time.monotonic()
    try:
        req = GenerateRequest("r", PROMPT, SamplingParams(max_tokens=2))
        events = [ev async for ev in engine.generate(req)]
        assert events[-1].finish_reason is not None
        return inner, stats, time.monotonic() - t0
    finally:
        await engine.stop()


def local_fallback(inner: HandoffEngine, stats: RemotePrefillStats, marked: bool = True) -> None:
    assert stats.outcomes["local_fallback"] == 1, stats.outcomes
    assert stats.outcomes["remote"] == 0
    assert inner.requests[-1].disagg is None  # prefilled here, nothing of the sibling's
    assert stats.siblings_healthy == ({"http://p1": False} if marked else {})


async def test_a_good_sibling_hands_its_kv_over() -> None:
    inner, stats, _ = await run(sibling(lambda: httpx.Response(200, content=blob())))
    assert stats.outcomes["remote"] == 1
    assert inner.requests[-1].disagg is not None
    assert inner.requests[-1].disagg.kv_payload == blob()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(blob(fill=float("nan")), id="nan"),
        pytest.param(blob(fill=float("inf")), id="inf"),
        pytest.param(blob(tokens=len(PROMPT) - 1), id="too-few-tokens"),
        pytest.param(blob(shape=(2, 2, len(PROMPT), 2, 2)), id="other-shape"),
        pytest.param(blob()[:-5], id="truncated"),
    ],
)
async def test_bad_kv_is_a_sibling_fault(bad: bytes) -> None:
    inner, stats, _ = await run(sibling(lambda: httpx.Response(200, content=bad)))
    local_fallback(inner, stats)


async def test_first_tokens_out_of_the_vocabulary_are_a_sibling_fault() -> None:
    """Before: the engine refused them and the client got a 400."""
    answer = {**PREFILL_ANSWER, "first_token_ids": [10**6]}
    kv = sibling(lambda: httpx.Response(200, content=blob()), answer=answer)
    inner, stats, _ = await run(kv)
    local_fallback(inner, stats)


async def test_the_kv_pull_is_capped_at_the_prompts_size() -> None:
    cap = kv_check.max_blob_bytes(LAYOUT, len(PROMPT))
    assert cap is not None
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        for _ in range(8 + cap // (1 << 20)):  # 1 MiB chunks, no Content-Length
            sent.append(1)
            yield b"\0" * (1 << 20)

    inner, stats, _ = await run(sibling(lambda: httpx.Response(200, content=endless())))
    local_fallback(inner, stats)
    assert len(sent) <= 2 + cap // (1 << 20)
    declared = httpx.Response(200, content=b"x" * (cap + 1))  # its Content-Length says it all
    inner, stats, _ = await run(sibling(lambda: declared))
    local_fallback(inner, stats)


@pytest.mark.parametrize("health", [200, 503])
async def test_a_dripping_sibling_meets_the_deadline(health: int) -> None:
    """One byte every 0.2 s resets any read timeout; the call's deadline still ends it. Slow is
    not dead (issue 41): the sibling is marked unhealthy only when its /health fails too."""

    async def drip() -> AsyncIterator[bytes]:
        for byte in blob():
            await asyncio.sleep(0.2)
            yield bytes([byte])

    async with asyncio.timeout(10):  # before the deadline: ~9 minutes for 2.7 KB
        inner, stats, took = await run(
            sibling(lambda: httpx.Response(200, content=drip()), health=health),
            remote_prefill_timeout=1.0,
        )
    local_fallback(inner, stats, marked=health != 200)
    assert took < 5.0, took


def test_finite_check_reads_each_dtype() -> None:
    """The exponent masks against numpy's own NaN and infinity (float32 and float16); bfloat16
    and float8_e4m3fn by their bit patterns (0x7FC0, 0x7F)."""
    for dtype, name in ((np.float32, "torch.float32"), (np.float16, "torch.float16")):
        layout = f"llama:1x1x2:{name}:bs16"
        for value, ok in ((1.5, True), (np.nan, False), (np.inf, False), (-np.inf, False)):
            data = np.array([[[[value, 0.0]]], [[[0.0, 0.0]]]], dtype=dtype)[None].tobytes()
            header = {"kv_layout": layout, "dtype": name, "shape": (1, 2, 1, 1, 2)}
            b = kv_wire.encode({**header, "block_size": 16, "num_tokens": 1}, data)
            if ok:
                kv_check.check_blob(b, layout, 1)
            else:
                with pytest.raises(kv_wire.KvWireError, match="NaN"):
                    kv_check.check_blob(b, layout, 1)
    for name, bad, good in (
        ("torch.bfloat16", np.uint16(0x7FC0), np.uint16(0x3F80)),
        ("torch.float8_e4m3fn", np.uint8(0xFF), np.uint8(0x7E)),
    ):
        layout = f"llama:1x1x2:{name}:bs16"
        header = {"kv_layout": layout, "dtype": name, "shape": (1, 2, 1, 1, 2)}
        for value, ok in ((good, True), (bad, False)):
            data = np.array([value, good, good, good]).tobytes()
            b = kv_wire.encode({**header, "block_size": 16, "num_tokens": 1}, data)
            if ok:
                kv_check.check_blob(b, layout, 1)
            else:
                with pytest.raises(kv_wire.KvWireError):
                    kv_check.check_blob(b, layout, 1)

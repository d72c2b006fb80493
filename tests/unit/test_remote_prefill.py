"""RemotePrefillEngine's decisions against scripted siblings (httpx.MockTransport): local vs
remote, fallback, --require-remote-prefill, the compatibility check at the first request, and
the least-outstanding sibling choice."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pytest

from tests.fake_engine import FakeEngine
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.disagg.remote_prefill import RemotePrefillEngine, SiblingMismatchError
from trtllm_gateway.engine.disagg.siblings import SiblingPool
from trtllm_gateway.engine.protocol import (
    EngineInfo,
    GenerateRequest,
    RemotePrefillFailedError,
    SamplingParams,
)
from trtllm_gateway.engine.stats import RemotePrefillStats

INFO = EngineInfo(model_id="m", max_model_len=512, vocab_size=100, eos_token_ids=(), kv_layout="L1")
PROMPT = tuple(range(1, 41))


def sibling(
    layout: str = "L1", fail: bool = False, down_for: int = 0, busy: bool = False
) -> tuple[httpx.MockTransport, list[str]]:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if fail or len(seen) <= down_for:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ready"})
        if request.url.path == "/internal/v1/info":
            return httpx.Response(
                200, json={"protocol_version": 1, "model": "m", "kv_layout": layout}
            )
        if request.url.path == "/internal/v1/prefill" and busy:
            error = {"message": "overloaded", "code": "queue_full"}
            return httpx.Response(503, json={"error": error}, headers={"Retry-After": "1"})
        if request.url.path == "/internal/v1/prefill":
            return httpx.Response(
                200,
                json={
                    "first_token_ids": [7],
                    "first_logprobs": None,
                    "disaggregated_params": {
                        "ctx_request_id": "r",
                        "opaque_state": base64.b64encode(b"state").decode(),
                    },
                },
            )
        return httpx.Response(404)

    return httpx.MockTransport(handler), seen


async def run(
    transport: httpx.MockTransport, pause: float = 0.0, **settings: Any
) -> tuple[list[Any], RemotePrefillStats]:
    stats = RemotePrefillStats()
    s = Settings(mode="decode", prefill_url=["http://p1"], **settings).parts().disagg
    engine = RemotePrefillEngine(FakeEngine(INFO, [5, 6]), s, stats, transport=transport)
    await engine.start()
    await asyncio.sleep(pause)  # let a sibling's backoff run out
    try:
        req = GenerateRequest("r", PROMPT, SamplingParams(max_tokens=2))
        return [ev async for ev in engine.generate(req)], stats
    finally:
        await engine.stop()


async def test_long_prompt_goes_remote() -> None:
    transport, seen = sibling()
    events, stats = await run(transport, max_local_prefill_tokens=8)
    assert "POST /internal/v1/prefill" in seen
    assert stats.outcomes["remote"] == 1
    assert events[-1].finish_reason is not None


async def test_siblings_get_the_internal_key_and_never_a_client_key() -> None:
    auths: list[str | None] = []
    inner, _ = sibling()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/internal/"):
            auths.append(request.headers.get("authorization"))
        return inner.handle_request(request)

    _, stats = await run(
        httpx.MockTransport(handler),
        max_local_prefill_tokens=8,
        api_key=["sk-client"],
        internal_api_key="int-key",
    )
    assert stats.outcomes["remote"] == 1
    assert len(auths) >= 2 and set(auths) == {"Bearer int-key"}  # /info, /prefill


async def test_short_prompt_stays_local() -> None:
    transport, seen = sibling()
    _, stats = await run(transport, max_local_prefill_tokens=64)
    assert "POST /internal/v1/prefill" not in seen
    assert stats.outcomes["local_short"] == 1


async def test_failed_sibling_falls_back_or_fails_when_required() -> None:
    transport, _ = sibling(fail=True)
    events, stats = await run(transport, max_local_prefill_tokens=0)
    assert stats.outcomes["local_fallback"] == 1 and events[-1].finish_reason is not None
    assert stats.siblings_healthy == {"http://p1": False}
    with pytest.raises(RemotePrefillFailedError):
        await run(transport, max_local_prefill_tokens=0, require_remote_prefill=True)


async def test_busy_sibling_is_retried_then_local_by_policy_and_stays_healthy() -> None:
    """A 503 (the sibling's admission is full, or it drains) is not a failure: retried
    --remote-prefill-retries times, then prefilled locally by policy; the sibling is never
    marked unhealthy."""
    transport, seen = sibling(busy=True)
    events, stats = await run(transport, max_local_prefill_tokens=0, remote_prefill_retries=2)
    assert seen.count("POST /internal/v1/prefill") == 3  # the first ask and two retries
    assert stats.outcomes == {"local_busy": 1} and events[-1].finish_reason is not None
    assert stats.busy_answers == {"http://p1": 3}
    assert stats.siblings_healthy.get("http://p1") is not False  # never marked unhealthy
    with pytest.raises(RemotePrefillFailedError):
        await run(transport, max_local_prefill_tokens=0, require_remote_prefill=True)


async def test_incompatible_sibling_is_refused_at_start_up() -> None:
    transport, _ = sibling(layout="OTHER")
    with pytest.raises(SiblingMismatchError, match="incompatible"):
        await run(transport, max_local_prefill_tokens=0)


async def test_incompatible_sibling_is_refused_at_the_first_request() -> None:
    """Down at start-up, so the check happens when the first request wants it."""
    transport, seen = sibling(layout="OTHER", down_for=1)
    with pytest.raises(RemotePrefillFailedError, match="incompatible"):
        await run(transport, pause=0.05, max_local_prefill_tokens=0, sibling_backoff=0.01)
    assert "GET /health" in seen and "POST /internal/v1/prefill" not in seen


def test_pool_picks_least_outstanding_round_robin_and_backs_off() -> None:
    pool = SiblingPool(["http://a", "http://b", "http://c"], backoff=60)
    a, b, c = pool.siblings
    a.outstanding, b.outstanding, c.outstanding = 2, 1, 1
    picks = {pool.pick().url for _ in range(4)}  # type: ignore[union-attr]
    assert picks == {"http://b", "http://c"}
    pool.mark(b, healthy=False)
    pool.mark(c, healthy=False)
    assert pool.pick() is a
    pool.mark(a, healthy=False)
    assert pool.pick() is None

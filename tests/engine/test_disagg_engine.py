"""Context phase on one built-in engine, decode on another: same tokens as one engine alone."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tests.engine.conftest import EngineFactory, collect, greedy
from trtllm_gateway.engine.protocol import DisaggParams, GenerateRequest, InvalidRequestError


async def test_prefill_then_import_equals_aggregated(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    prefill = await make_engine(block_size=8)
    decode = await make_engine(block_size=8)
    for i, ids in enumerate(chat_prompts[:3]):
        req = GenerateRequest(f"d{i}", tuple(ids), greedy(20, logprobs=1))
        expected = await collect(decode, replace(req, request_id=f"agg{i}"))
        res = await prefill.prefill(req)
        assert prefill.health().kv_usage > 0  # blocks held for the pull
        blob = await prefill.pull_kv(req.request_id)
        disagg = DisaggParams(
            "generation_only", res.first_token_ids, res.first_logprobs, req.request_id, None, blob
        )
        events = await collect(decode, replace(req, disagg=disagg))
        got = [t for ev in events for t in ev.token_ids]
        assert got == [t for ev in expected for t in ev.token_ids]
        got_lp = [lp.logprob for ev in events for lp in ev.logprobs or ()]
        exp_lp = [lp.logprob for ev in expected for lp in ev.logprobs or ()]
        assert max(abs(a - b) for a, b in zip(got_lp, exp_lp, strict=True)) < 1e-4
    # Pulled blocks are back in the pool of the prefill engine (cached, not in use).
    assert prefill.health().kv_usage == 0.0


async def test_unpulled_kv_expires_and_pull_twice_fails(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    prefill = await make_engine(kv_handoff_timeout=0.5, enable_prefix_caching=False)
    req = GenerateRequest("x", tuple(chat_prompts[0]), greedy(8))
    await prefill.prefill(req)
    assert prefill.health().kv_usage > 0
    for _ in range(40):
        await asyncio.sleep(0.1)
        if prefill.health().kv_usage == 0.0:
            break
    assert prefill.health().kv_usage == 0.0
    with pytest.raises(InvalidRequestError):
        await prefill.pull_kv("x")


async def test_a_renewed_lease_outlives_the_hand_off_timeout(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    """Issue 41 item 5: while the decode side waits it renews the lease (RenewKv through the
    core's pipe), and the KV stays held past the 0.5 s timeout; unrenewed, it then expires."""
    prefill = await make_engine(kv_handoff_timeout=0.5, enable_prefix_caching=False)
    req = GenerateRequest("x", tuple(chat_prompts[0]), greedy(8))
    await prefill.prefill(req)
    for _ in range(8):  # 1.6 s, three timeouts, renewed every 0.2 s
        await asyncio.sleep(0.2)
        prefill.renew_kv("x")
    assert prefill.health().kv_usage > 0
    prefill.renew_kv("unknown")  # a no-op, like a release of an unknown id
    blob = await prefill.pull_kv("x")
    assert len(blob) > 0
    await prefill.prefill(replace(req, request_id="y"))
    for _ in range(40):
        await asyncio.sleep(0.1)
        if prefill.health().kv_usage == 0.0:
            break
    assert prefill.health().kv_usage == 0.0
    with pytest.raises(InvalidRequestError):
        await prefill.pull_kv("y")


async def test_mismatched_layout_is_refused(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    prefill = await make_engine(block_size=8)
    decode = await make_engine(block_size=16)
    req = GenerateRequest("m", tuple(chat_prompts[0]), greedy(8))
    res = await prefill.prefill(req)
    blob = await prefill.pull_kv("m")
    disagg = DisaggParams("generation_only", res.first_token_ids, None, "m", None, blob)
    with pytest.raises(InvalidRequestError, match="layout"):
        await collect(decode, replace(req, disagg=disagg))

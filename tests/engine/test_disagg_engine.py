"""Context phase on one built-in engine, decode on another: same tokens as one engine alone."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import replace

import msgspec
import pytest

from tests.engine.conftest import EngineFactory, collect, greedy, thread_core
from trtllm_gateway.engine.builtin.kv_transfer_worker import KvTransferWorker
from trtllm_gateway.engine.kv_region import KvPayload, KvRegion
from trtllm_gateway.engine.protocol import (
    DisaggParams,
    GenerateRequest,
    InvalidRequestError,
    TokenEvent,
)
from trtllm_gateway.engine.transport.client import CoreClient


def _tokens(events: list[TokenEvent]) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


async def _payload(prefill: CoreClient, request_id: str, how: str) -> object:
    """The decode side's kv_payload as each transport hands it over."""
    if how == "blob":  # protocol v1: a kv_wire blob, the region freed by the pull
        return await prefill.pull_kv(request_id)
    region = await prefill.stage_kv(request_id)
    if how == "shm":  # one host: the decode core copies from the prefill core's arena
        return KvPayload(region)
    data = bytes(prefill.arenas.view(region))  # the HTTP path: the bytes, in a frame
    frame = msgspec.structs.replace(region, transport="frame", arena="", offset=0)
    return KvPayload(frame, data)


@pytest.mark.parametrize("how", ["shm", "frame", "blob"])
async def test_prefill_then_import_equals_aggregated(
    make_engine: EngineFactory, chat_prompts: list[list[int]], how: str
) -> None:
    prefill = await make_engine(block_size=8)
    decode = await make_engine(block_size=8)
    for i, ids in enumerate(chat_prompts[:3]):
        req = GenerateRequest(f"d{i}", tuple(ids), greedy(20, logprobs=1))
        expected = await collect(decode, replace(req, request_id=f"agg{i}"))
        res = await prefill.prefill(req)
        # Staged before the answer: the blocks are back, the KV waits in the arena.
        assert prefill.health().kv_usage == 0.0
        kv = await _payload(prefill, req.request_id, how)
        disagg = DisaggParams(
            "generation_only", res.first_token_ids, res.first_logprobs, req.request_id, None, kv
        )
        events = await collect(decode, replace(req, disagg=disagg))
        prefill.release_kv(req.request_id)
        assert _tokens(events) == _tokens(expected)
        got_lp = [lp.logprob for ev in events for lp in ev.logprobs or ()]
        exp_lp = [lp.logprob for ev in expected for lp in ev.logprobs or ()]
        assert max(abs(a - b) for a, b in zip(got_lp, exp_lp, strict=True)) < 1e-4
    with pytest.raises(InvalidRequestError):  # released: nothing is held any more
        await prefill.stage_kv("d0")


async def test_nan_kv_in_a_region_is_refused_and_frees_the_reserved_blocks(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    prefill = await make_engine(block_size=8)
    decode = await make_engine(block_size=8)
    req = GenerateRequest("n", tuple(chat_prompts[0]), greedy(8))
    res = await prefill.prefill(req)
    region = await prefill.stage_kv("n")
    prefill.arenas.view(region)[:4] = struct.pack("<f", float("nan"))
    disagg = DisaggParams(
        "generation_only", res.first_token_ids, None, "n", None, KvPayload(region)
    )
    with pytest.raises(InvalidRequestError, match="NaN"):
        await collect(decode, replace(req, disagg=disagg))
    prefill.release_kv("n")
    assert decode.health().kv_usage == 0.0


async def test_unpulled_kv_expires_and_pull_twice_fails(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    prefill = await make_engine(kv_handoff_timeout=0.5, enable_prefix_caching=False)
    for request_id in ("x", "y"):
        req = GenerateRequest(request_id, tuple(chat_prompts[0]), greedy(8))
        await prefill.prefill(req)
        await prefill.stage_kv(request_id)  # staged, held for the lease
    await prefill.pull_kv("y")
    with pytest.raises(InvalidRequestError):
        await prefill.pull_kv("y")  # pulled once only
    for _ in range(40):
        await asyncio.sleep(0.1)
        try:
            await prefill.stage_kv("x")
        except InvalidRequestError:
            break
    else:
        pytest.fail("staged KV outlived its lease")


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
    # The KV is staged in the transfer arena (its blocks were freed at once, issue 41): held
    # past three timeouts, it is still there to pull.
    prefill.renew_kv("unknown")  # a no-op, like a release of an unknown id
    blob = await prefill.pull_kv("x")
    assert len(blob) > 0
    await prefill.prefill(replace(req, request_id="y"))
    await asyncio.sleep(2.5)  # unrenewed: past its 0.5 s lease and the core's 1 s expiry tick
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


async def test_a_paged_hand_off_holds_its_blocks_until_released_or_expired(
    make_engine: EngineFactory, chat_prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU prefill core's cuda_ipc hand-off is paged: the region names the prompt's blocks in
    its shared pool (KvTransferWorker.pool_region), which stay held for the sibling. Modelled
    here on the CPU with pool_region describing the blocks as DevicePool.describe does: the
    blocks are held until the sibling's release, or until the lease ends; then the region is
    gone and every block is back (KvHandoffs' bookkeeping of paged regions)."""

    def pool_region(self: KvTransferWorker, block_table: list[int], tokens: int) -> KvRegion:
        used = tuple(block_table[: -(-tokens // self.block_size)])
        return KvRegion(
            transport="cuda_ipc", arena="pool", offset=0, nbytes=1, shape=(1,), dtype="x",
            kv_layout="l", blocks=used, pool_slots=1,
        )  # fmt: skip

    monkeypatch.setattr(KvTransferWorker, "pool_region", pool_region)
    prefill = await make_engine(kv_handoff_timeout=0.5, enable_prefix_caching=False)
    core = thread_core(prefill)
    ctx = DisaggParams("context_only", kv_device=True)
    for request_id in ("released", "expired"):
        req = GenerateRequest(request_id, tuple(chat_prompts[0]), greedy(8), disagg=ctx)
        await prefill.prefill(req)
        assert (await prefill.stage_kv(request_id)).blocks  # paged: the held blocks
    assert core.health().kv_active_blocks > 0
    prefill.release_kv("released")
    with pytest.raises(InvalidRequestError):
        await prefill.stage_kv("released")
    assert (await prefill.stage_kv("expired")).blocks  # still held: its lease runs
    for _ in range(40):  # the lease (0.5 s) and the core's 1 s expiry tick
        await asyncio.sleep(0.1)
        try:
            await prefill.stage_kv("expired")
        except InvalidRequestError:
            break
    else:
        pytest.fail("a paged hand-off outlived its lease")
    assert core.health().kv_active_blocks == 0
    assert not core._k._paged and not core._k.staged
    clock = core._k.clock  # what the core logs when it stops: its step thread's cost by call
    assert clock.count == 2 and {"stage", "exported", "release"} <= clock.by_call.keys()
    assert clock.summary().startswith("2 KV hand-offs, the step thread ")
    assert clock.longest.keys() == clock.by_call.keys()  # each kind's longest call, for outliers
    assert all(clock.longest[k] <= clock.by_call[k] for k in clock.longest)
    assert clock.cpu_by_call.keys() == clock.by_call.keys()  # wall against the thread's CPU
    assert "its CPU time by call (us)" in clock.summary()
    assert clock.calls.keys() == clock.by_call.keys() and clock.calls["release"] == 1
    assert "calls a hand-off: " in clock.summary()

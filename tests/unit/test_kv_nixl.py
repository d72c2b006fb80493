"""engine/disagg/kv_nixl.py with the real NIXL (the nixl-cu12 wheel `make install` puts in the
venv; UCX between two agents of this process): a staged region read into the receive arena
byte for byte; a range outside the sibling's arena refused before any transfer; a read whose
caller is cancelled frees its receive region once the READ has stopped; a sibling whose agent
answer is not NIXL's is a NixlError. The path end to end with the real model:
tests/engine/test_disagg_v2.py's nixl cases.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import msgspec
import numpy as np
import pytest

from trtllm_gateway.engine.disagg import kv_nixl
from trtllm_gateway.engine.disagg.kv_receive import KvReceiveArena
from trtllm_gateway.engine.kv_region import PROBE_BYTES, KvRegion, ShmArena

LAYOUT = "m:2x2x64:torch.float32:bs8"  # 2 layers, 2 heads, 64 dims: 2 KiB a token
TOKENS = 300


def test_nixl_is_installed() -> None:
    """The NIXL tests below must not pass by finding nothing to test."""
    assert kv_nixl.available()


@pytest.fixture
def staged() -> tuple[ShmArena, KvRegion, bytes]:
    arena = ShmArena(4 << 20)
    nbytes = 2 * 2 * TOKENS * 2 * 64 * 4
    offset = arena.alloc.alloc(nbytes, "ctx", float("inf"))
    assert offset is not None and offset >= PROBE_BYTES
    payload = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    arena.view(offset, nbytes)[:] = payload
    region = KvRegion(
        transport="shm", arena=arena.name, offset=offset, nbytes=nbytes,
        shape=(2, 2, TOKENS, 2, 64), dtype="torch.float32", kv_layout=LAYOUT,
    )  # fmt: skip
    yield arena, region, payload
    arena.close()


async def _pull(
    decode: kv_nixl.NixlEnd, prefill: kv_nixl.NixlEnd, arena: ShmArena, region: KvRegion,
    receive: KvReceiveArena, rid: str,
) -> KvRegion | None:  # fmt: skip
    async def fetch(name: str) -> bytes:
        assert name == arena.name
        return msgspec.json.encode(prefill.expose(name, arena.buf))

    return await kv_nixl.pull(decode, "sib", region, receive, rid, fetch, 30.0)


async def test_a_staged_region_is_read_into_the_receive_arena(staged: Any) -> None:
    arena, region, payload = staged
    prefill, decode = kv_nixl.NixlEnd("prefill"), kv_nixl.NixlEnd("decode")
    receive = KvReceiveArena(LAYOUT, 1024)
    try:
        for rid in ("r0", "r1"):  # the sibling's agent is loaded once, then reused
            mine = await _pull(decode, prefill, arena, region, receive, rid)
            assert mine is not None and mine.transport == "shm" and mine.nbytes == len(payload)
            landed = receive._arena
            assert landed is not None
            assert bytes(landed.view(mine.offset, mine.nbytes)) == payload
            receive.free(rid)
        assert decode.known("sib", arena.name)
    finally:
        receive.close()
        decode.close()
        prefill.close()


async def test_a_range_outside_the_siblings_arena_is_refused(staged: Any) -> None:
    arena, region, _ = staged
    prefill, decode = kv_nixl.NixlEnd("prefill"), kv_nixl.NixlEnd("decode")
    receive = KvReceiveArena(LAYOUT, 1024)
    try:
        past = msgspec.structs.replace(region, offset=len(arena.buf) - region.nbytes // 2)
        with pytest.raises(kv_nixl.NixlError, match="outside arena"):
            await _pull(decode, prefill, arena, past, receive, "r0")
        landed = receive._arena
        assert landed is not None and landed.alloc.owners() == []  # its region went back
    finally:
        receive.close()
        decode.close()
        prefill.close()


async def test_a_cancelled_pull_frees_its_region_once_the_read_stopped(
    staged: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    arena, region, _ = staged
    prefill, decode = kv_nixl.NixlEnd("prefill"), kv_nixl.NixlEnd("decode")
    receive = KvReceiveArena(LAYOUT, 1024)
    started, release = threading.Event(), threading.Event()
    read = decode.read

    def slow_read(*args: Any) -> None:  # a READ still in flight when its caller gives up
        started.set()
        release.wait(10)
        read(*args)

    monkeypatch.setattr(decode, "read", slow_read)
    try:
        task = asyncio.ensure_future(_pull(decode, prefill, arena, region, receive, "r0"))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        landed = receive._arena
        assert landed is not None and landed.alloc.owners() == ["r0"]  # still being read into
        release.set()
        t0 = time.monotonic()
        while landed.alloc.owners() and time.monotonic() - t0 < 10:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # freed by the read thread's done callback
        assert landed.alloc.owners() == []
    finally:
        release.set()
        receive.close()
        decode.close()
        prefill.close()


async def test_an_answer_that_is_no_nixl_agent_is_an_error(staged: Any) -> None:
    _, region, _ = staged
    decode = kv_nixl.NixlEnd("decode")
    receive = KvReceiveArena(LAYOUT, 1024)

    async def fetch(name: str) -> bytes:
        return b'{"metadata": "bm90IG5peGw=", "addr": 1, "size": 2}'  # "not nixl"

    try:
        with pytest.raises(kv_nixl.NixlError):
            await kv_nixl.pull(decode, "sib", region, receive, "r0", fetch, 5.0)
        landed = receive._arena
        assert landed is not None and landed.alloc.owners() == []
    finally:
        receive.close()
        decode.close()

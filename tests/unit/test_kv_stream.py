"""engine/disagg/kv_stream.py: protocol v2's HTTP frames, and what a hostile sibling's stream gets
(issue 40's checks on the v2 path): a header of another shape refused before any payload is
buffered, a truncated or corrupted payload, bytes past the digest, an oversized header."""

from __future__ import annotations

import os
import struct
from collections.abc import AsyncIterator

import pytest

from trtllm_gateway.engine.disagg import kv_check, kv_stream
from trtllm_gateway.engine.disagg.kv_wire import KvWireError
from trtllm_gateway.engine.kv_region import KvRegion

LAYOUT = "llama:2x1x4:torch.float32:bs16"
TOKENS = 40


def region(tokens: int = TOKENS) -> KvRegion:
    return KvRegion(
        transport="shm", arena="tgkv_x", offset=4096, nbytes=2 * 2 * tokens * 4 * 4,
        shape=(2, 2, tokens, 1, 4), dtype="torch.float32", kv_layout=LAYOUT,
    )  # fmt: skip


async def frames(r: KvRegion, data: bytes) -> list[bytes]:
    return [bytes(f) async for f in kv_stream.frames(r, memoryview(data))]


async def chunks(parts: list[bytes], size: int = 7) -> AsyncIterator[bytes]:
    blob = b"".join(parts)
    for i in range(0, len(blob), size):  # cut anywhere: header, payload and digest split
        yield blob[i : i + size]


def check(r: KvRegion) -> None:
    kv_check.check_region(r, LAYOUT, TOKENS)


async def test_frames_round_trip_through_any_chunking() -> None:
    data = os.urandom(region().nbytes)
    parts = await frames(region(), data)
    assert sum(map(len, parts)) == kv_stream.stream_bytes(region())
    got, payload = await kv_stream.read(chunks(parts), check)
    assert bytes(payload) == data and got.transport == "frame" and got.arena == ""


async def test_a_header_of_another_shape_is_refused_before_the_payload() -> None:
    bad = region(TOKENS + 8)
    parts = await frames(bad, bytes(bad.nbytes))
    reader = kv_stream.KvStreamReader(check)
    with pytest.raises(KvWireError, match="the prompt needs"):
        await reader.feed(parts[0])
    assert reader.data is None  # nothing allocated for it


@pytest.mark.parametrize("fault", ["truncated", "corrupt", "trailing", "no-digest"])
async def test_a_damaged_stream_is_refused(fault: str) -> None:
    data = os.urandom(region().nbytes)
    head, *payload, digest = await frames(region(), data)
    body = b"".join(payload)
    parts = {
        "truncated": [head, body[:-5], digest],
        "corrupt": [head, body[:-1] + bytes([body[-1] ^ 1]), digest],
        "trailing": [head, body, digest, b"x"],
        "no-digest": [head, body],
    }[fault]
    with pytest.raises(KvWireError):
        await kv_stream.read(chunks(parts, 1 << 12), check)


async def test_an_oversized_header_is_refused() -> None:
    with pytest.raises(KvWireError, match="header"):
        await kv_stream.read(chunks([struct.pack("<I", 1 << 30), b"{}"]), check)

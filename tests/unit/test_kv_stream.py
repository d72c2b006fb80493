"""engine/disagg/kv_stream.py: protocol v2's HTTP frames, and what a hostile sibling's stream gets
(issue 40's checks on the v2 path): a header of another shape refused before any payload is
buffered, a truncated or corrupted payload, bytes past the digest, an oversized header."""

from __future__ import annotations

import os
import struct

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


class Chunked:
    """A stream that hands out at most `size` bytes a read: header, payload and digest split
    anywhere, as a socket may."""

    def __init__(self, parts: list[bytes], size: int = 7) -> None:
        self.blob, self.at, self.size = b"".join(parts), 0, size

    def readinto(self, b: memoryview, /) -> int:
        n = min(len(b), self.size, len(self.blob) - self.at)
        b[:n] = self.blob[self.at : self.at + n]
        self.at += n
        return n


def check(r: KvRegion) -> None:
    kv_check.check_region(r, LAYOUT, TOKENS)


def read(parts: list[bytes], size: int = 7) -> tuple[KvRegion, bytearray]:
    out = bytearray()

    def place(r: KvRegion) -> memoryview:
        out.extend(bytes(r.nbytes))
        return memoryview(out)

    return kv_stream.read(Chunked(parts, size), check, place), out


async def test_frames_round_trip_through_any_chunking() -> None:
    data = os.urandom(region().nbytes)
    parts = await frames(region(), data)
    assert sum(map(len, parts)) == kv_stream.stream_bytes(region())
    got, payload = read(parts)
    assert bytes(payload) == data and got.transport == "frame" and got.arena == ""


async def test_a_header_of_another_shape_is_refused_before_the_payload() -> None:
    bad = region(TOKENS + 8)
    parts = await frames(bad, bytes(bad.nbytes))
    placed: list[KvRegion] = []

    def place(r: KvRegion) -> memoryview:
        placed.append(r)
        return memoryview(bytearray(r.nbytes))

    with pytest.raises(KvWireError, match="the prompt needs"):
        kv_stream.read(Chunked(parts), check, place)
    assert placed == []  # nothing allocated for it


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
        read(parts, 1 << 12)


def test_an_oversized_header_is_refused() -> None:
    with pytest.raises(KvWireError, match="header"):
        read([struct.pack("<I", 1 << 30), b"{}"])


async def test_a_payload_of_many_chunks_is_hashed_as_it_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kv_stream, "CHUNK", 96)  # the hash runs behind the reads, chunk by chunk
    data = os.urandom(region().nbytes)
    head, *payload, digest = await frames(region(), data)
    _, out = read([head, *payload, digest], 50)
    assert bytes(out) == data
    with pytest.raises(KvWireError, match="checksum"):
        read([head, bytes(b ^ 0xFF for b in b"".join(payload)), digest], 50)

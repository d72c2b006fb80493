"""The HTTP path's KV stream (protocol v2's GET /internal/v2/kv/{id}): header and payload as
separate frames, the checksum after them.

    u32 little-endian header length | header JSON (a KvRegion, transport "frame")
    | payload (header.nbytes bytes, [layers, 2, tokens, kv_heads, head_dim]) | BLAKE3 (32 bytes)

The sender yields slices of the staged region in place (no concatenation, no copy in Python);
both ends hash on a thread while the next chunk moves, so the checksum never stalls the stream
(v1 hashed the whole blob before the first byte and again after the last). The receiver writes
into one buffer allocated from the header, capped by what the prompt needs (kv_check.py).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from blake3 import blake3

from trtllm_gateway.engine.disagg.kv_wire import KvWireError
from trtllm_gateway.engine.kv_region import KvRegion

CHUNK = 4 << 20
DIGEST = 32
MAX_HEADER = 64 * 1024


def head(region: KvRegion) -> bytes:
    raw = msgspec.json.encode(msgspec.structs.replace(region, transport="frame", arena=""))
    return struct.pack("<I", len(raw)) + raw


async def frames(region: KvRegion, view: memoryview) -> AsyncIterator[bytes | memoryview]:
    """The stream of one region: its header, its bytes in place, their digest."""
    yield head(region)
    hasher = blake3()
    pending: asyncio.Future[blake3] | None = None
    for i in range(0, len(view), CHUNK):
        chunk = view[i : i + CHUNK]
        if pending is not None:
            await pending
        pending = asyncio.ensure_future(asyncio.to_thread(hasher.update, chunk))
        yield chunk
    if pending is not None:
        await pending
    yield hasher.digest()


def stream_bytes(region: KvRegion) -> int:
    return len(head(region)) + region.nbytes + DIGEST


class KvStreamReader:
    """Feeds on a response's chunks; region and data once the digest checked out.

    check(region) runs on the header before any payload is buffered (shape, dtype, size caps)
    and raises KvWireError to refuse it."""

    def __init__(self, check: Callable[[KvRegion], None]) -> None:
        self._check = check
        self._buf = bytearray()  # the header, then the digest
        self.region: KvRegion | None = None
        self.data: bytearray | None = None
        self._got = 0
        self._hashed = 0
        self._hasher = blake3()
        self._pending: Awaitable[object] | None = None

    async def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        if self.region is None:
            view = self._header(view)
            if self.region is None:
                return
        assert self.data is not None
        room = len(self.data) - self._got
        if room > 0 and len(view):
            take = view[:room]
            self.data[self._got : self._got + len(take)] = take
            self._got += len(take)
            view = view[room:]
            if self._got - self._hashed >= CHUNK:
                await self._hash()
        if len(view):
            self._buf += view
            if len(self._buf) > DIGEST:
                raise KvWireError("KV stream runs past its digest")

    def _header(self, view: memoryview) -> memoryview:
        self._buf += view
        if len(self._buf) < 4:
            return memoryview(b"")
        (hlen,) = struct.unpack("<I", self._buf[:4])
        if hlen > MAX_HEADER:
            raise KvWireError(f"KV stream header of {hlen} bytes")
        if len(self._buf) < 4 + hlen:
            return memoryview(b"")
        try:
            region = msgspec.json.decode(bytes(self._buf[4 : 4 + hlen]), type=KvRegion)
        except msgspec.DecodeError as e:  # ValidationError included
            raise KvWireError(f"bad KV stream header: {e}") from None
        self._check(region)
        rest = bytes(self._buf[4 + hlen :])
        self._buf = bytearray()
        self.region = region
        self.data = bytearray(region.nbytes)
        return memoryview(rest)

    async def _hash(self) -> None:
        """Hash what arrived since the last call on a thread, while the next chunks arrive."""
        if self._pending is not None:
            await self._pending
        assert self.data is not None
        part = memoryview(self.data)[self._hashed : self._got]
        self._hashed = self._got
        self._pending = asyncio.ensure_future(asyncio.to_thread(self._hasher.update, part))

    async def finish(self) -> tuple[KvRegion, bytearray]:
        if self.data is not None and self._got > self._hashed:
            await self._hash()
        if self._pending is not None:
            await self._pending
        if self.region is None or self.data is None or self._got != len(self.data):
            raise KvWireError("KV stream truncated")
        if len(self._buf) != DIGEST:
            raise KvWireError("KV stream lacks its digest")
        if self._hasher.digest() != bytes(self._buf):
            raise KvWireError("KV payload checksum mismatch")
        return self.region, self.data


async def read(
    chunks: AsyncIterator[bytes], check: Callable[[KvRegion], None]
) -> tuple[KvRegion, bytearray]:
    reader = KvStreamReader(check)
    async for chunk in chunks:
        await reader.feed(chunk)
    return await reader.finish()

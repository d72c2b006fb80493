"""The HTTP path's KV stream (protocol v2's GET /internal/v2/kv/{id}): header and payload as
separate frames, the checksum after them.

    u32 little-endian header length | header JSON (a KvRegion, transport "frame")
    | payload (header.nbytes bytes, [layers, 2, tokens, kv_heads, head_dim]) | BLAKE3 (32 bytes)

The sender yields slices of the staged region in place (no concatenation, no copy in Python) and
hashes each on a thread while the next one moves. The receiver (KvPull, on a thread of its own)
reads with the standard library's http.client straight into the buffer its caller places after
the header (the API server's receive arena: its core copies the region from there like a
sibling's shm region), and hashes what arrived on another thread while the next chunk comes: the
checksum never stalls the stream. httpx's pure-Python h11 parser moved 0.4 GB/s here, where
loopback TCP moves 2.9 (docs/benchmarks.md, issue 41).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol
from urllib.parse import urlsplit

import msgspec
from blake3 import blake3

from trtllm_gateway.engine.disagg.kv_wire import KvWireError
from trtllm_gateway.engine.kv_region import KvRegion

CHUNK = 4 << 20
DIGEST = 32
MAX_HEADER = 64 * 1024

_hashers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kv-hash")


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


class Readable(Protocol):
    def readinto(self, b: memoryview, /) -> int: ...


class KvPullError(Exception):
    """The sibling answered the GET with something other than a stream (status, or None when
    the connection failed); a bad stream itself is a KvWireError."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


Place = Callable[[KvRegion], memoryview]  # where a checked header's payload goes


def read(src: Readable, check: Callable[[KvRegion], None], place: Place) -> KvRegion:
    """One stream from src into place(region) (blocking): check(region) runs on the header
    before anything is placed and raises KvWireError to refuse it; the digest is checked after
    the payload, and a stream running past its digest is refused."""
    raw = _exactly(src, 4, "header length")
    (hlen,) = struct.unpack("<I", raw)
    if hlen > MAX_HEADER:
        raise KvWireError(f"KV stream header of {hlen} bytes")
    try:
        region = msgspec.json.decode(_exactly(src, hlen, "header"), type=KvRegion)
    except msgspec.DecodeError as e:  # ValidationError included
        raise KvWireError(f"bad KV stream header: {e}") from None
    check(region)
    dst = place(region)
    if len(dst) != region.nbytes:
        raise KvWireError(f"placed {len(dst)} bytes for a {region.nbytes}-byte region")
    hasher = blake3()
    pending: Future[object] | None = None
    got = hashed = 0
    try:
        while got < len(dst):
            n = src.readinto(dst[got : min(got + CHUNK, len(dst))])
            if not n:
                raise KvWireError("KV stream truncated")
            got += n
            if got - hashed >= CHUNK or got == len(dst):
                if pending is not None:
                    pending.result()
                pending = _hashers.submit(hasher.update, dst[hashed:got])
                hashed = got
    finally:
        if pending is not None:
            pending.result()
    digest = _exactly(src, DIGEST, "digest")
    if src.readinto(memoryview(bytearray(1))):
        raise KvWireError("KV stream runs past its digest")
    if hasher.digest() != digest:
        raise KvWireError("KV payload checksum mismatch")
    return region


def _exactly(src: Readable, n: int, what: str) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = src.readinto(view[got:])
        if not k:
            raise KvWireError(f"KV stream truncated in its {what}")
        got += k
    return bytes(buf)


class KvPull:
    """One GET of a sibling's KV stream on a thread (run), abortable from another (abort: the
    connection is shut, the read ends at once). timeout_s bounds the whole pull."""

    def __init__(
        self, url: str, headers: Mapping[str, str], max_bytes: int | None, timeout_s: float
    ) -> None:
        self.url = url
        self.headers = dict(headers)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._aborted = False

    def run(self, check: Callable[[KvRegion], None], place: Place) -> KvRegion:
        """Raises KvPullError (no stream), KvWireError (a bad one), TimeoutError."""
        parts = urlsplit(self.url)
        https = parts.scheme == "https"
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        deadline = time.monotonic() + self.timeout_s
        conn = kind(parts.hostname or "", parts.port, timeout=self.timeout_s)
        with self._lock:
            if self._aborted:
                raise KvPullError("aborted")
            self._conn = conn
        try:
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            try:
                conn.request("GET", path, headers=self.headers)
                res = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise KvPullError(f"{type(e).__name__}: {e}") from None
            if res.status != 200:
                text = res.read(200).decode(errors="replace")
                raise KvPullError(f"GET {self.url} answered {res.status}: {text}", res.status)
            declared, cap = res.getheader("content-length", ""), self.max_bytes
            if cap is not None and declared.isdigit() and int(declared) > cap:
                raise KvPullError(f"{self.url} declares {declared} bytes, more than {cap}")
            try:
                return read(_Timed(res, conn, deadline, self), check, place)
            except (OSError, http.client.HTTPException) as e:
                if isinstance(e, TimeoutError) or time.monotonic() >= deadline:
                    why = f"GET {self.url} took more than {self.timeout_s:g} s"
                    raise TimeoutError(why) from None
                raise KvPullError(f"{type(e).__name__}: {e}") from None
        finally:
            conn.close()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            sock = self._conn.sock if self._conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Timed:
    """The response's readinto under what is left of the pull's deadline."""

    def __init__(
        self,
        res: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        deadline: float,
        pull: KvPull,
    ) -> None:
        self.res, self.conn, self.deadline, self.pull = res, conn, deadline, pull

    def readinto(self, b: memoryview, /) -> int:
        if self.pull._aborted:
            raise KvPullError("aborted")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline")
        if self.conn.sock is not None:
            self.conn.sock.settimeout(left)
        return self.res.readinto(b)

"""A staged prompt KV's place in a prefill core's arena: the descriptor siblings exchange, the
arena's allocator, and the host arena opened by name.

    prefill core: gather the blocks ─▶ region of its arena ──(descriptor over HTTP, v2)──▶
    decode core: copy the region into the blocks it reserved ─▶ DELETE: the region is free

On one host's GPUs the prompt is not gathered: the descriptor names the prefill core's KV pool
and the prompt's blocks in it (a paged region), the decode core reads them across into its own
blocks in one kernel, and the prefill core holds those blocks until the DELETE.

An arena is allocated once per core: a shared-memory segment (`shm`: CPU, and the host staging of
the HTTP path) or a buffer on the GPU (`cuda_ipc`, its IPC handle opened once per peer). A region
holds [layers, 2, tokens, kv_heads, head_dim] contiguous, in the cache's dtype. No torch here: the
API server streams the host arena's bytes from here (routers/internal/disagg.py).
"""

from __future__ import annotations

import _posixshmem  # type: ignore[import-not-found]
import contextlib
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import msgspec

logger = logging.getLogger(__name__)

ARENA_PREFIX = "tgkv_"  # a sibling may name only segments of ours
_ARENA_NAME = re.compile(r"^/?tgkv_[0-9a-f_]{1,64}$")
ALIGN = 4096
SHM_DIR = "/dev/shm"
PROBE_BYTES = 64  # an arena's first bytes: its token, so a reader proves it shares /dev/shm


class KvRegionError(ValueError):
    """A descriptor that names no arena of ours, or a range outside it."""


class CudaIpcHandle(msgspec.Struct, frozen=True, kw_only=True):
    """torch's UntypedStorage._share_cuda_() of a device arena, as JSON (no pickle: a sibling's
    bytes are never unpickled). Fields in _share_cuda_'s order
    (torch/multiprocessing/reductions.py, reduce_tensor); bytes as hex."""

    device: int
    handle: str
    size: int
    offset: int
    ref_counter_handle: str
    ref_counter_offset: int
    event_handle: str
    event_sync_required: bool


class KvRegion(msgspec.Struct, frozen=True, kw_only=True):
    """Where one staged prompt KV lies: arena, byte range, shape and dtype.

    A paged region (blocks set, cuda_ipc only) is not staged at all: ipc names the prefill
    core's whole KV pool [layers, 2, pool_slots, kv_heads, head_dim], which starts `offset`
    bytes into that allocation, and token t of the prompt lies in slot
    blocks[t // block_size] * block_size + t % block_size; the decode core reads those slots
    across in place. nbytes is then the prompt's KV, the bytes that move."""

    transport: str  # "shm" or "cuda_ipc"
    arena: str  # the segment's name (shm) or the device arena's id (cuda_ipc)
    offset: int
    nbytes: int
    shape: tuple[int, ...]  # [layers, 2, tokens, kv_heads, head_dim]
    dtype: str  # str(torch dtype)
    kv_layout: str
    ipc: CudaIpcHandle | None = None
    blocks: tuple[int, ...] = ()  # a paged region's block ids in the sibling's pool
    pool_slots: int = 0  # a paged region's pool size in token slots


@dataclass(frozen=True, slots=True)
class KvPayload:
    """A decode-side request's KV (DisaggParams.kv_payload): a sibling's region to copy from,
    or, from the HTTP path, its bytes (data) described by region (transport "frame")."""

    region: KvRegion
    data: bytes | bytearray | None = None


@dataclass(slots=True)
class _Span:
    offset: int
    size: int
    owner: str
    deadline: float


class RegionAllocator:
    """First-fit byte ranges of one arena, each owned by a request id until freed or expired."""

    def __init__(self, size: int, start: int = 0) -> None:
        self.size = size
        self.start = start
        self._spans: list[_Span] = []  # sorted by offset

    def alloc(self, nbytes: int, owner: str, deadline: float) -> int | None:
        """The offset of a free range of nbytes (ALIGN-aligned), or None when none is free."""
        need = -(-max(nbytes, 1) // ALIGN) * ALIGN
        at = self.start
        for i, span in enumerate(self._spans):
            if span.offset - at >= need:
                self._spans.insert(i, _Span(at, need, owner, deadline))
                return at
            at = span.offset + span.size
        if self.size - at >= need:
            self._spans.append(_Span(at, need, owner, deadline))
            return at
        return None

    def free(self, owner: str) -> bool:
        for i, span in enumerate(self._spans):
            if span.owner == owner:
                del self._spans[i]
                return True
        return False

    def renew(self, owner: str, deadline: float) -> bool:
        """A lease renewed (the decode side still waits): owner's range expires at deadline."""
        for span in self._spans:
            if span.owner == owner:
                span.deadline = max(span.deadline, deadline)
                return True
        return False

    def expire(self, now: float) -> list[str]:
        """Free the ranges past their deadline; their owners."""
        gone = [s.owner for s in self._spans if s.deadline <= now]
        self._spans = [s for s in self._spans if s.deadline > now]
        return gone

    def owners(self) -> list[str]:
        return [s.owner for s in self._spans]

    @property
    def used(self) -> int:
        return sum(s.size for s in self._spans)


def untracked(shm: SharedMemory) -> SharedMemory:
    """A segment this process only reads or writes: its creator unlinks it, not our tracker."""
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


class HostArenas:
    """Host arenas opened by name, once each (a reader: an API server, a decode core)."""

    def __init__(self) -> None:
        self._open: dict[str, SharedMemory] = {}
        self._lock = threading.Lock()

    def view(self, region: KvRegion) -> memoryview:
        """The region's bytes in place. Raises KvRegionError."""
        if not _ARENA_NAME.match(region.arena):
            raise KvRegionError(f"{region.arena!r} is not a KV arena")
        shm = self.segment(region.arena)
        end = region.offset + region.nbytes
        if region.offset < PROBE_BYTES or region.nbytes <= 0 or end > shm.size:
            raise KvRegionError(
                f"KV region [{region.offset}, {end}) is outside arena {region.arena} "
                f"({shm.size} bytes)"
            )
        buf = shm.buf
        assert buf is not None
        return buf[region.offset : end]

    def segment(self, name: str) -> SharedMemory:
        with self._lock:
            shm = self._open.get(name)
            if shm is None:
                try:
                    shm = untracked(SharedMemory(name=name))
                except (FileNotFoundError, ValueError, OSError) as e:
                    raise KvRegionError(f"KV arena {name!r} cannot be opened: {e}") from None
                self._open[name] = shm
            return shm

    def token(self, name: str) -> bytes:
        """The arena's probe token (its first bytes), or b"" when it cannot be opened here."""
        if not _ARENA_NAME.match(name):
            return b""
        try:
            buf = self.segment(name).buf
        except KvRegionError:
            return b""
        assert buf is not None
        return bytes(buf[:PROBE_BYTES]).rstrip(b"\0")


class ShmArena:
    """A shared-memory segment (tgkv_*) this process creates, fills and unlinks at close: a
    prefill core's staging arena (engine/builtin/kv_staging.py, HostArena), or an API server's
    receive arena for the HTTP path's stream (a region its core then copies like a sibling's)."""

    def __init__(self, size: int) -> None:
        self.name = f"{ARENA_PREFIX}{os.getpid():x}_{secrets.token_hex(4)}"
        # Untracked: a reader in this very process (a core in a thread of the API server) would
        # drop the tracker's entry, and the tracker would fail on ours; close() unlinks it.
        self.shm = untracked(SharedMemory(name=self.name, create=True, size=size))
        buf = self.shm.buf
        assert buf is not None
        self.buf: memoryview = buf
        self.token = secrets.token_hex(16).encode()
        buf[: len(self.token)] = self.token
        self.alloc = RegionAllocator(size, start=PROBE_BYTES)

    def view(self, offset: int, nbytes: int) -> memoryview:
        return self.buf[offset : offset + nbytes]

    def close(self) -> None:
        del self.buf
        try:
            self.shm.close()
        except BufferError:  # a region view is still alive: the unlink below still frees it
            logger.debug("KV arena %s closed with views alive", self.name)
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink(self.shm._name)  # type: ignore[attr-defined]


def arena_bytes(staging_mb: int, token_bytes: int, max_model_len: int) -> int:
    """--kv-staging-mb, or twice max_model_len tokens of KV within half of /dev/shm's room."""
    if staging_mb > 0:
        return staging_mb << 20
    want = 2 * max_model_len * token_bytes
    try:
        st = os.statvfs(SHM_DIR)
        want = min(want, st.f_bavail * st.f_frsize // 2)
    except OSError:
        pass
    return max(want, 1 << 20)

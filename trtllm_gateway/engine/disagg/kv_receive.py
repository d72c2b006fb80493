"""The API server's receive arena: where the HTTP path's KV stream lands, for its core to copy.

    sibling ──HTTP stream──▶ KvPull (a thread) ──readinto──▶ this arena's region
    core: copies the region into the blocks it reserved (as from a same-host sibling's shm arena)

One shared-memory segment per API server, made at the first HTTP pull and sized as a core's
staging arena (twice max_model_len tokens of KV within half of /dev/shm's room). The stream's
bytes are read once, into place: no frame through the core's socket, no copy of it on the way
(a 256 MiB frame spent ~600 ms in ZMQ and a bytearray on a 2-core VM). A region that does not
fit, or a /dev/shm without room, takes the frame path instead (place() returns None). Regions
are taken from the pull's thread and freed from the event loop: one lock.
"""

from __future__ import annotations

import logging
import threading

from trtllm_gateway.engine.disagg.kv_check import KvShape
from trtllm_gateway.engine.kv_region import KvRegion, ShmArena, arena_bytes

logger = logging.getLogger(__name__)


class KvReceiveArena:
    def __init__(self, kv_layout: str, max_model_len: int) -> None:
        self.kv_layout = kv_layout
        self.max_model_len = max_model_len
        self._arena: ShmArena | None = None
        self._failed = False
        self._lock = threading.Lock()

    def place(self, request_id: str, region: KvRegion) -> tuple[memoryview, KvRegion] | None:
        """Room for region's bytes, and the shm region naming them; None: use a frame."""
        with self._lock:
            arena = self._open()
            if arena is None:
                return None
            offset = arena.alloc.alloc(region.nbytes, request_id, float("inf"))
            if offset is None:
                return None
            mine = KvRegion(
                transport="shm", arena=arena.name, offset=offset, nbytes=region.nbytes,
                shape=region.shape, dtype=region.dtype, kv_layout=region.kv_layout,
            )  # fmt: skip
            return arena.view(offset, region.nbytes), mine

    def whole(self) -> memoryview | None:
        """The whole arena (a NIXL agent registers it), made now; None when there is none."""
        with self._lock:
            arena = self._open()
            return None if arena is None else arena.buf

    def free(self, request_id: str) -> None:
        with self._lock:
            if self._arena is not None:
                self._arena.alloc.free(request_id)

    def disable(self, why: str) -> None:
        """The core could not copy from this arena: every later pull takes a frame."""
        with self._lock:
            if not self._failed:
                logger.warning("HTTP KV stream lands in frames from now on: %s", why)
            self._failed = True

    def close(self) -> None:
        with self._lock:
            if self._arena is not None:
                self._arena.close()
            self._arena = None
            self._failed = True

    def _open(self) -> ShmArena | None:
        if self._arena is not None or self._failed:
            return self._arena
        shape = KvShape.of(self.kv_layout)
        if shape is None:
            self._failed = True
            return None
        size = arena_bytes(0, shape.nbytes(1), self.max_model_len)
        try:
            self._arena = ShmArena(size)
        except OSError as e:
            logger.warning("no KV receive arena in shared memory (%d bytes): %s", size, e)
            self._failed = True
        return self._arena

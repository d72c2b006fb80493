"""A scripted core's staging arena: real shared memory, so CoreClient reads regions in place."""

from __future__ import annotations

import secrets
from multiprocessing.shared_memory import SharedMemory

from trtllm_gateway.engine.kv_region import ARENA_PREFIX, PROBE_BYTES, KvRegion

LAYOUT = "scripted:1x1x1:torch.float32:bs16"


class ScriptedArena:
    """One segment; stage() writes a region of float32 KV for one token per 8 bytes."""

    def __init__(self, size: int = 1 << 16) -> None:
        self.shm = SharedMemory(
            name=f"{ARENA_PREFIX}{secrets.token_hex(6)}", create=True, size=size
        )
        self.at = PROBE_BYTES
        self.released: list[str] = []

    def stage(self, data: bytes) -> KvRegion:
        """data, padded to whole tokens (8 bytes: K and V of one float32 each)."""
        data = data.ljust(-(-len(data) // 8) * 8, b"\0")
        buf = self.shm.buf
        assert buf is not None
        buf[self.at : self.at + len(data)] = data
        region = KvRegion(
            transport="shm", arena=self.shm.name, offset=self.at, nbytes=len(data),
            shape=(1, 2, len(data) // 8, 1, 1), dtype="torch.float32", kv_layout=LAYOUT,
        )  # fmt: skip
        self.at += len(data)
        return region

    def close(self) -> None:
        self.shm.close()
        self.shm.unlink()

"""The same-host GPU hand-off without staging: a prefill core's pool read across in place.

    prefill core: a context phase ends ─▶ DevicePool.describe: the prompt's block ids in its
                  pool (shared once over CUDA IPC), its blocks held until the sibling is done
    decode core:  AcrossReader.read: the pool mapped in this GPU's context (peer_memory.py),
                  then one kernel reads those blocks across NVLink into the blocks reserved
                  here, counting NaN / infinite values on the way

No gather into an arena, no copy engine, no event between the cores: the prefill core's step
thread saw the context phase's sampled token, so its KV writes are done. The gathered device
arena (kv_staging.DeviceArena) stays the fallback for caches that are not one pool or a handle
that cannot be mapped. Issue 41, bench.kv_copy on two H200 (2026-11-27): an 8B prompt's 2,048
tokens (256 MiB) handed over in 1.12-1.23 ms, 63-65% of the peer copy's bandwidth measured in
the same runs; the staged arena took 1.85-2.05 ms (37-39%).
"""

from __future__ import annotations

import logging

import torch

from trtllm_gateway.engine.builtin.backend import KvCaches
from trtllm_gateway.engine.builtin.kv_staging import (
    Sources,
    nbytes_of,
    pool_of,
    share_storage,
    whole_words,
)
from trtllm_gateway.engine.builtin.peer_memory import mem_handle
from trtllm_gateway.engine.kv_region import KvRegion, KvRegionError

logger = logging.getLogger(__name__)


class DevicePool:
    """The core's KV pool shared once over CUDA IPC (cuda_ipc, paged): a prompt's region is
    its block ids, read across by the decode core while this core holds the blocks."""

    transport = "cuda_ipc"

    def __init__(self, pool: torch.Tensor, layout: str) -> None:
        self.pool = pool
        self.layout = layout
        storage = pool.untyped_storage()
        self.ipc = share_storage(storage)
        mem_handle(self.ipc)  # KvRegionError for a handle a sibling could not map
        self.offset = pool.data_ptr() - storage.data_ptr()
        self.slots = pool.shape[2]

    @classmethod
    def of(cls, caches: KvCaches, layout: str) -> DevicePool | None:
        """The caches' pool shared, or None (and why, logged once) when a sibling could not
        read it in place: not one pool, rows not whole words, a handle it cannot map."""
        pool = pool_of(caches)
        if pool is None or pool.device.type != "cuda" or not whole_words(caches):
            logger.info("KV pool not shared in place (not one pool): cuda_ipc hand-offs stage")
            return None
        try:
            return cls(pool, layout)
        except (KvRegionError, RuntimeError) as e:
            logger.warning("KV pool not shared in place (%s): cuda_ipc hand-offs stage", e)
            return None

    def describe(self, block_table: list[int], tokens: int, block_size: int) -> KvRegion:
        layers, two, _, *rest = self.pool.shape
        shape = (layers, two, tokens, *rest)
        dtype = str(self.pool.dtype)
        return KvRegion(
            transport=self.transport, arena=self.ipc.handle[:32], offset=self.offset,
            nbytes=nbytes_of(shape, dtype), shape=shape, dtype=dtype, kv_layout=self.layout,
            ipc=self.ipc, blocks=tuple(block_table[: -(-tokens // block_size)]),
            pool_slots=self.slots,
        )  # fmt: skip


class AcrossReader:
    """The decode side: a sibling pool's paged regions read into this core's pool, one kernel
    each. Made once per core (the pool's views are found once: pool_of walks every layer)."""

    def __init__(self, caches: KvCaches, block_size: int, sources: Sources) -> None:
        pool = pool_of(caches)
        if pool is None or not whole_words(caches):
            raise KvRegionError("this core's KV caches are not one pool: no paged copy across")
        from trtllm_gateway.engine.builtin.kernels.kv_blocks import pool_words  # Triton

        self.pool, self.words, self.block_size = pool, pool_words(pool), block_size
        self.blocks = pool.view(*pool.shape[:2], -1, block_size, *pool.shape[3:])
        self.sources = sources

    def read(self, region: KvRegion, block_table: list[int]) -> bool:
        """The region's blocks (checked against its pool, mapped in this GPU's context:
        peer_memory.py) -> block_table's, if all finite; False, and those blocks zeroed, when
        not. Enqueued on the current stream; returns once the NaN count is read."""
        from trtllm_gateway.engine.builtin.kernels.kv_blocks import across

        check_paged(region, self.block_size)
        assert region.ipc is not None
        device = self.pool.device
        addr = self.sources.peers.open(region.ipc, device.index or 0) + region.offset
        n = len(region.blocks)
        # One copy up: the NaN count (from 0), the sibling's block ids, then ours.
        host = torch.tensor((0, *region.blocks, *block_table[:n]), dtype=torch.int32)
        up = host.to(device, non_blocking=True)
        bad, src, dst = up[:1], up[1 : 1 + n], up[1 + n :]
        across(addr, region.pool_slots, self.words, self.pool.dtype, src, dst,
               region.shape[2], self.block_size, bad)  # fmt: skip
        if int(bad.item()) == 0:
            return True
        self.blocks.view(torch.uint8)[:, :, dst.long()] = 0  # no NaN left for a later sequence
        return False


def check_paged(region: KvRegion, block_size: int) -> None:
    """KvRegionError unless a paged region's blocks and pool lie inside its allocation."""
    layers, two, tokens = region.shape[:3]
    if region.ipc is None or region.transport != "cuda_ipc" or tokens <= 0:
        raise KvRegionError("a paged KV region needs a CUDA IPC handle and tokens")
    row = region.nbytes // (layers * two * tokens)  # one token's bytes of one layer's K or V
    blocks = region.pool_slots // block_size
    if len(region.blocks) != -(-tokens // block_size) or not region.blocks:
        raise KvRegionError(f"{len(region.blocks)} blocks for {tokens} tokens")
    if min(region.blocks) < 0 or max(region.blocks) >= blocks:
        raise KvRegionError(f"a block id outside the sibling pool's {blocks} blocks")
    end = region.offset + layers * two * region.pool_slots * row
    if region.offset < 0 or end > region.ipc.size:
        raise KvRegionError(f"the sibling pool [{region.offset}, {end}) is outside its allocation")

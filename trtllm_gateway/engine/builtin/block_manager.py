"""Paged KV-cache block manager: reference counts, chained prefix hashes, LRU reuse of free blocks.

A block holds block_size token slots. A full block is named by the hash of its tokens chained to
the hash of the block before it (plus an extra key, e.g. image hashes), so two requests with the
same prefix share blocks. Freed blocks keep their hash and stay reusable until they are evicted,
least recently freed first.

With an event log attached (`events`), the cache's changes go out as KV events
(engine/kv_events/log.py), as TensorRT-LLM's block manager publishes them: a block registered
under a new hash is stored (with its parent's hash and its tokens), an evicted hash is removed, and
clear_cache() clears all.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence as Seq

from blake3 import blake3

from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventSink,
    MmSpan,
    signed64,
)

_PACKERS: dict[int, struct.Struct] = {}


def block_hash(prev: bytes, tokens: Seq[int], extra: bytes = b"") -> bytes:
    """BLAKE3 of the parent's hash, the tokens as little-endian uint32 and the extra key (the
    three in one buffer: the same digest as three updates, for less work a block)."""
    n = len(tokens)
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS[n] = struct.Struct(f"<{n}I")
    # packer.pack raises on an id outside uint32.
    return blake3(b"".join((prev, packer.pack(*tokens), extra))).digest(length=16)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        # Free blocks, oldest first; blocks that still carry a hash are reusable until popped.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.events: KvEventSink | None = None
        self.dp_rank = 0  # the data-parallel rank its events name (--data-parallel-rank)

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, hashes: Seq[bytes]) -> list[int]:
        """Cached blocks for the leading full blocks of a prompt, in order, up to the first miss."""
        found: list[int] = []
        if not self.caching:
            return found
        for h in hashes:
            block = self.cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def acquire(self, blocks: Seq[int]) -> None:
        """Take a reference on cached blocks found by match_prefix."""
        for b in blocks:
            if self.ref_count[b] == 0:
                del self.free[b]
            self.ref_count[b] += 1

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free)

    def allocate(self, n: int) -> list[int]:
        free = self.free
        if n > len(free):
            raise MemoryError(f"need {n} KV blocks, {len(free)} free")
        # Locals, not attributes, in the loops here and in release(): a 2,048-token prompt is
        # 128 blocks, allocated and released on the engine's step thread (issue 41: its time
        # a hand-off).
        pop, hash_of, cached, ref_count = free.popitem, self.hash_of, self.cached, self.ref_count
        out = []
        evicted: list[int] = []
        for _ in range(n):
            b, _ = pop(last=False)
            old = hash_of[b]
            if old is not None:
                if cached.get(old) == b:
                    del cached[old]
                    evicted.append(signed64(old))
                hash_of[b] = None
            ref_count[b] = 1
            out.append(b)
        if evicted and self.events is not None:
            self.events.append(BlockRemoved(tuple(evicted), dp_rank=self.dp_rank))
        return out

    def release(self, blocks: Seq[int]) -> None:
        """Drop one reference each; tail blocks first so they are evicted before the prefix."""
        ref_count, free = self.ref_count, self.free
        for b in reversed(blocks):
            left = ref_count[b] - 1
            if left <= 0:
                if left < 0:
                    raise AssertionError(f"block {b} released twice")
                free[b] = None
            ref_count[b] = left

    def register(
        self,
        block: int,
        h: bytes,
        parent: bytes | None = None,
        tokens: Seq[int] = (),
        mm: tuple[MmSpan, ...] = (),
    ) -> None:
        """A block just became full: make it findable by its chained hash (parent: the hash of
        the block before it, None for the first; tokens: its token ids, and mm: the images its
        hash covers, for the stored event)."""
        if not self.caching or self.hash_of[block] is not None:
            return
        self.hash_of[block] = h
        if self.cached.setdefault(h, block) == block and self.events is not None:
            # Positional (BlockStored's field order): keywords cost more, a block a step each.
            self.events.append(
                BlockStored(
                    (signed64(h),),
                    None if parent is None else signed64(parent),
                    tuple(tokens),
                    self.block_size,
                    None,
                    self.dp_rank,
                    (mm,) if mm else (),
                )
            )

    def clear_cache(self) -> None:
        """Forget every cached hash (blocks in use keep their data, but no longer match)."""
        self.cached.clear()
        self.hash_of = [None] * self.num_blocks
        if self.events is not None:
            self.events.append(AllBlocksCleared(dp_rank=self.dp_rank))

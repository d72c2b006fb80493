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
from collections import deque
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


def _pack(tokens: Seq[int]) -> bytes:
    """The tokens as little-endian uint32 (raises on an id outside uint32)."""
    n = len(tokens)
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS[n] = struct.Struct(f"<{n}I")
    return packer.pack(*tokens)


def _digest(prev: bytes, packed: bytes | memoryview, extra: bytes) -> bytes:
    """The three in one buffer: the same digest as three updates, for less work a block."""
    return blake3(b"".join((prev, packed, extra))).digest(length=16)


def block_hash(prev: bytes, tokens: Seq[int], extra: bytes = b"") -> bytes:
    """BLAKE3 of the parent's hash, the tokens as little-endian uint32 and the extra key."""
    return _digest(prev, _pack(tokens), extra)


def block_hashes(prev: bytes, tokens: Seq[int], block_size: int, extra: bytes = b"") -> list[bytes]:
    """block_hash of each whole block of tokens in turn, each chained to the one before (the
    first to prev): the tokens packed once, not a block at a time (a 1,024-token prompt's 64
    blocks at admission)."""
    n = len(tokens) // block_size
    packed = memoryview(_pack(tokens[: n * block_size]))
    width = 4 * block_size
    out = []
    for i in range(n):
        prev = _digest(prev, packed[i * width : (i + 1) * width], extra)
        out.append(prev)
    return out


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        # Free blocks, least recently freed first; blocks that still carry a hash are reusable
        # until popped. A queue with stale entries, not an ordered set: release() appends, and
        # a block taken back off the free list (acquire) or freed again later leaves its older
        # entry behind, skipped when popped. `_queued` counts each block's entries: an entry is
        # the block's place in the order when it is its last one and the block is free. An
        # OrderedDict insert a block was ~0.3 us (~40 us to release a 2,048-token prompt's 128
        # blocks on a 120k-block cache, the prefill side's largest call a hand-off: issue 41).
        self._queue: deque[int] = deque(range(num_blocks))
        self._queued = [1] * num_blocks
        self._num_free = num_blocks
        self.events: KvEventSink | None = None
        self.dp_rank = 0  # the data-parallel rank its events name (--data-parallel-rank)

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def usage(self) -> float:
        return 1.0 - self._num_free / self.num_blocks

    def free_blocks(self) -> list[int]:
        """The free blocks, least recently freed first (the order allocate() takes them)."""
        left, ref_count = self._queued[:], self.ref_count
        out = []
        for b in self._queue:
            left[b] -= 1
            if not left[b] and not ref_count[b]:
                out.append(b)
        return out

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
        ref_count = self.ref_count
        for b in blocks:
            if ref_count[b] == 0:
                self._num_free -= 1  # its queue entry goes stale
            ref_count[b] += 1

    def can_allocate(self, n: int) -> bool:
        return n <= self._num_free

    def allocate(self, n: int) -> list[int]:
        if n > self._num_free:
            raise MemoryError(f"need {n} KV blocks, {self._num_free} free")
        # Locals, not attributes, in the loops here and in release(): a 2,048-token prompt is
        # 128 blocks, allocated and released on the engine's step thread (issue 41: its time
        # a hand-off).
        pop, queued = self._queue.popleft, self._queued
        hash_of, cached, ref_count = self.hash_of, self.cached, self.ref_count
        out: list[int] = []
        evicted: list[int] = []
        while len(out) < n:
            b = pop()
            left = queued[b] = queued[b] - 1
            if left or ref_count[b]:
                continue  # stale: freed again later, or taken back (acquire)
            old = hash_of[b]
            if old is not None:
                if cached.get(old) == b:
                    del cached[old]
                    evicted.append(signed64(old))
                hash_of[b] = None
            ref_count[b] = 1
            out.append(b)
        self._num_free -= n
        if evicted and self.events is not None:
            self.events.append(BlockRemoved(tuple(evicted), dp_rank=self.dp_rank))
        return out

    def release(self, blocks: Seq[int]) -> None:
        """Drop one reference each; tail blocks first so they are evicted before the prefix."""
        ref_count, queued = self.ref_count, self._queued
        freed: list[int] = []
        for b in reversed(blocks):
            left = ref_count[b] - 1
            if left <= 0:
                if left < 0:
                    self._requeue(freed)
                    raise AssertionError(f"block {b} released twice")
                freed.append(b)
                queued[b] += 1
            ref_count[b] = left
        self._requeue(freed)

    def _requeue(self, freed: list[int]) -> None:
        self._queue.extend(freed)
        self._num_free += len(freed)
        if len(self._queue) > 2 * self.num_blocks:  # mostly stale entries: drop them
            order = self.free_blocks()
            self._queue = deque(order)
            self._queued = queued = [0] * self.num_blocks
            for b in order:
                queued[b] = 1

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
        hash covers, for the stored event): register_run's one-block case, the decodes' (a
        block a sequence in block_size steps) at a call less."""
        if not self.caching or self.hash_of[block] is not None:
            return
        self.hash_of[block] = h
        if self.cached.setdefault(h, block) == block and self.events is not None:
            # Positional (BlockStored's field order): keywords cost more.
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

    def register_run(
        self,
        blocks: Seq[int],
        hashes: Seq[bytes],
        parent: bytes | None,
        tokens: Seq[int],
        mm: Seq[tuple[MmSpan, ...]] = (),
    ) -> None:
        """Blocks of one sequence that just became full, in order, each hash chained to the one
        before it (the first to parent): register each; tokens: block_size of them a block; mm:
        each block's images, or () for a text prompt.

        The stored event is one a run of blocks newly stored (vLLM's block pool and TensorRT-LLM
        publish a request's new blocks together): a 1,024-token prompt is one event, not 64
        (the engine thread built, and every API server decoded, one a block). A block already
        registered, or whose hash another block holds, ends a run."""
        if not self.caching:
            return
        hash_of, cached, events = self.hash_of, self.cached, self.events
        run = 0  # the first block of the run of newly stored blocks being gathered
        for i, (block, h) in enumerate(zip(blocks, hashes, strict=True)):
            if hash_of[block] is None:
                hash_of[block] = h
                if cached.setdefault(h, block) == block:
                    continue  # stored: the run goes on
            if events is not None and i > run:
                self._stored(hashes, run, i, parent, tokens, mm)
            run = i + 1
        if events is not None and len(blocks) > run:
            self._stored(hashes, run, len(blocks), parent, tokens, mm)

    def _stored(
        self,
        hashes: Seq[bytes],
        lo: int,
        hi: int,
        parent: bytes | None,
        tokens: Seq[int],
        mm: Seq[tuple[MmSpan, ...]],
    ) -> None:
        """The event for hashes[lo:hi], newly stored."""
        assert self.events is not None
        bs = self.block_size
        before = hashes[lo - 1] if lo else parent
        # Positional (BlockStored's field order): keywords cost more.
        self.events.append(
            BlockStored(
                tuple(map(signed64, hashes[lo:hi])),
                None if before is None else signed64(before),
                tuple(tokens[lo * bs : hi * bs]),
                bs,
                None,
                self.dp_rank,
                tuple(mm[lo:hi]) if any(mm[lo:hi]) else (),
            )
        )

    def clear_cache(self) -> None:
        """Forget every cached hash (blocks in use keep their data, but no longer match)."""
        self.cached.clear()
        self.hash_of = [None] * self.num_blocks
        if self.events is not None:
            self.events.append(AllBlocksCleared(dp_rank=self.dp_rank))

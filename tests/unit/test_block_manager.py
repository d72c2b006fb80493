"""BlockManager on its own: what it pins.

- allocation counts: `allocate` takes the free blocks it is asked for (refcount 1), refuses more
  than are free with MemoryError, and `release` gives them back; a double release asserts;
- the prefix cache: a full block registered under its chained hash is found again by
  `match_prefix` up to the first miss, the chain makes a block's hash depend on every block before
  it (and on the extra key, e.g. image hashes), and nothing is cached with caching off;
- refcounts: `acquire` on a shared block adds a reference, so the block stays in use until the
  last holder releases it, and a cached block is taken off the free list while held;
- eviction: free blocks are reused oldest first (never used, then least recently freed, a
  sequence's tail before its prefix), and a freed cached block stays findable until reused;
- KV events: BlockStored (parent hash, tokens, block size) once per new hash, BlockRemoved when
  a cached hash is evicted, AllBlocksCleared on clear_cache, which also forgets every hash.
"""

from __future__ import annotations

import pytest

from trtllm_gateway.engine.builtin.block_manager import BlockManager, block_hash
from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventLog,
    signed64,
)

BS = 4


def _chain(tokens: list[int], extra: bytes = b"") -> list[bytes]:
    """The chained hashes of the full blocks of `tokens`, as the scheduler computes them."""
    hashes: list[bytes] = []
    for i in range(len(tokens) // BS):
        prev = hashes[-1] if hashes else b""
        hashes.append(block_hash(prev, tokens[i * BS : (i + 1) * BS], extra))
    return hashes


def _cache(bm: BlockManager, tokens: list[int]) -> list[int]:
    """Allocate and register the full blocks of `tokens`; returns the block ids, still held."""
    hashes = _chain(tokens)
    blocks = bm.allocate(len(hashes))
    for i, (b, h) in enumerate(zip(blocks, hashes, strict=True)):
        bm.register(b, h, hashes[i - 1] if i else None, tokens[i * BS : (i + 1) * BS])
    return blocks


def _events(log: KvEventLog) -> list[object]:
    records, lost = log.since(-1)
    assert not lost
    return [r.event for r in records]


def test_allocate_and_release_count_free_blocks() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS, enable_prefix_caching=True)
    assert bm.blocks_needed(0) == 0 and bm.blocks_needed(4) == 1 and bm.blocks_needed(5) == 2
    a = bm.allocate(4)
    assert len(set(a)) == 4 and bm.num_free == 2 and bm.usage == pytest.approx(4 / 6)
    assert all(bm.ref_count[b] == 1 for b in a)
    assert bm.can_allocate(2) and not bm.can_allocate(3)
    with pytest.raises(MemoryError, match="need 3 KV blocks, 2 free"):
        bm.allocate(3)
    assert bm.num_free == 2  # a refused allocation takes nothing
    bm.release(a)
    assert bm.num_free == 6 and bm.usage == 0.0
    with pytest.raises(AssertionError, match="released twice"):
        bm.release(a[:1])


def test_hash_chain_names_a_block_by_everything_before_it() -> None:
    a = _chain([1, 2, 3, 4, 5, 6, 7, 8])
    b = _chain([9, 9, 9, 9, 5, 6, 7, 8])
    assert a[1] != b[1]  # same tokens in block 1, different prefix
    assert _chain([1, 2, 3, 4]) == a[:1]
    assert _chain([1, 2, 3, 4], extra=b"img")[0] != a[0]
    assert len(a[0]) == 16


def test_prefix_hit_on_a_shared_prefix_up_to_the_first_miss() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    prompt = list(range(100, 112))  # three full blocks
    held = _cache(bm, prompt)
    assert bm.match_prefix(_chain(prompt)) == held
    # A prompt sharing the first two blocks, then diverging, finds exactly those two.
    other = [*prompt[:8], 0, 0, 0, 0]
    assert bm.match_prefix(_chain(other)) == held[:2]
    # A different first block misses everything after it, even where tokens agree.
    assert bm.match_prefix(_chain([0, 0, 0, 0, *prompt[4:]])) == []


def test_shared_blocks_are_refcounted() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    prompt = list(range(8))
    held = _cache(bm, prompt)
    bm.acquire(bm.match_prefix(_chain(prompt)))  # a second request on the same prefix
    assert [bm.ref_count[b] for b in held] == [2, 2]
    assert bm.num_free == 2
    bm.release(held)  # the first request finishes: the second still holds both
    assert [bm.ref_count[b] for b in held] == [1, 1] and bm.num_free == 2
    bm.release(held)
    assert bm.num_free == 4
    # Freed but cached: a later request acquires them back off the free list.
    found = bm.match_prefix(_chain(prompt))
    assert found == held
    bm.acquire(found)
    assert bm.num_free == 2 and all(b not in bm.free_blocks() for b in held)


def test_reuse_is_oldest_free_first_and_evicts_cached_hashes() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    bm.events = log = KvEventLog(BS, bm.num_blocks)
    prompt = list(range(8))
    held = _cache(bm, prompt)  # blocks 0, 1
    assert held == [0, 1]
    bm.release(held)  # tail first: block 1 is freed before block 0
    assert bm.free_blocks() == [2, 3, 1, 0]
    # Never-used blocks go first; the cached prefix survives them.
    assert bm.allocate(2) == [2, 3]
    assert bm.match_prefix(_chain(prompt)) == [0, 1]
    # Then the least recently freed: the tail (block 1) before the prefix (block 0).
    assert bm.allocate(1) == [1]
    assert bm.match_prefix(_chain(prompt)) == [0]
    removed = [e for e in _events(log) if isinstance(e, BlockRemoved)]
    assert removed == [BlockRemoved((signed64(_chain(prompt)[1]),))]


def test_stored_events_carry_parent_tokens_and_block_size_once_per_hash() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS, enable_prefix_caching=True)
    bm.events = log = KvEventLog(BS, bm.num_blocks)
    prompt = list(range(10, 18))
    first = _cache(bm, prompt)
    h = _chain(prompt)
    assert _events(log) == [
        BlockStored((signed64(h[0]),), None, (10, 11, 12, 13), BS),
        BlockStored((signed64(h[1]),), signed64(h[0]), (14, 15, 16, 17), BS),
    ]
    # Registering again, or another block with the same content, stores nothing new, and
    # evicting that duplicate removes nothing: the hash still names the first block.
    bm.register(first[0], h[0])
    dup = bm.allocate(1)[0]
    bm.register(dup, h[0], None, prompt[:4])
    assert len(_events(log)) == 2
    bm.release([dup])
    bm.allocate(bm.num_free)
    assert bm.match_prefix(h) == first
    assert not any(isinstance(e, BlockRemoved) for e in _events(log))


def test_clear_cache_forgets_hashes_and_says_so() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    bm.events = log = KvEventLog(BS, bm.num_blocks)
    prompt = list(range(8))
    held = _cache(bm, prompt)
    bm.clear_cache()
    assert bm.match_prefix(_chain(prompt)) == []
    assert _events(log)[-1] == AllBlocksCleared()
    # Blocks in use stay allocated; once reused, their old hashes raise no BlockRemoved.
    assert bm.num_free == 2
    bm.release(held)
    bm.allocate(4)
    assert not any(isinstance(e, BlockRemoved) for e in _events(log))


def test_no_cache_and_no_events_without_prefix_caching() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=False)
    bm.events = log = KvEventLog(BS, bm.num_blocks)
    prompt = list(range(8))
    _cache(bm, prompt)
    assert bm.match_prefix(_chain(prompt)) == []
    assert bm.cached == {} and _events(log) == []

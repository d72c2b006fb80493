"""BlockManager's free queue (stale entries skipped) against the ordered set it replaced.

The reference below is the free list as an OrderedDict, least recently freed first: release
appends a block whose last reference went, acquire takes a free one out of the middle, allocate
pops the oldest. A random walk of allocations, prefix hits on free blocks, shared references and
releases must give the same blocks in the same order, the same free count, and the same free
order; a small cache makes the queue's compaction (more than twice its blocks in entries) run.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from trtllm_gateway.engine.builtin.block_manager import BlockManager


class _Reference:
    def __init__(self, n: int) -> None:
        self.ref = [0] * n
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(n))

    def acquire(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        out = [self.free.popitem(last=False)[0] for _ in range(n)]
        for b in out:
            self.ref[b] = 1
        return out

    def free_list(self) -> list[int]:
        return list(self.free)

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None


@pytest.mark.parametrize("seed", range(6))
def test_free_order_matches_an_ordered_set(seed: int) -> None:
    rng = random.Random(seed)
    n = 24
    bm, ref = BlockManager(n, 4, enable_prefix_caching=True), _Reference(n)
    held: list[list[int]] = []  # each a request's blocks, one reference each
    for _ in range(3000):
        op = rng.random()
        if op < 0.1 and bm.num_free:
            k = rng.randint(1, min(6, bm.num_free))
            got = bm.allocate(k)
            assert got == ref.allocate(k)
            held.append(got)
        elif op < 0.55:
            # A prefix hit: blocks free (cached) or in use, taken with a reference each; hits
            # on free blocks leave stale entries behind.
            free = ref.free_list() if rng.random() < 0.7 else []
            pool = free if len(free) >= 4 else list(range(n))
            blocks = rng.sample(pool, rng.randint(1, 4))
            bm.acquire(blocks)
            ref.acquire(blocks)
            held.append(blocks)
        elif held:
            blocks = held.pop(rng.randrange(len(held)))
            bm.release(blocks)
            ref.release(blocks)
        assert bm.num_free == len(ref.free)
        assert bm.ref_count == ref.ref
        assert bm.free_blocks() == list(ref.free)
        assert len(bm._queue) <= 2 * n


def test_stale_entries_are_compacted() -> None:
    """A cached block freed and hit again and again, with nothing allocated: each cycle leaves
    a stale entry, and past twice the cache's blocks the queue keeps only the live ones."""
    n = 8
    bm, ref = BlockManager(n, 4, enable_prefix_caching=True), _Reference(n)
    a = bm.allocate(3)
    ref.allocate(3)
    lengths = []
    for i in range(40):
        block = [a[i % 3]]
        bm.release(block)
        ref.release(block)
        bm.acquire(block)
        ref.acquire(block)
        lengths.append(len(bm._queue))
        assert bm.free_blocks() == list(ref.free) and bm.num_free == len(ref.free)
    assert max(lengths) == 2 * n and min(lengths[10:]) < 2 * n  # it compacted, more than once
    assert bm.allocate(5) == ref.allocate(5)


def test_a_double_release_asserts_and_keeps_the_count() -> None:
    bm = BlockManager(4, 4, enable_prefix_caching=True)
    a = bm.allocate(2)
    bm.release(a[:1])
    with pytest.raises(AssertionError, match="released twice"):
        bm.release(a)  # a[1] is freed first (the tail), then a[0] a second time
    assert bm.num_free == 4 and bm.free_blocks() == [2, 3, 0, 1]

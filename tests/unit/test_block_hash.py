"""block_hash: the struct-packed tokens hash to the bytes the per-token encoding gave.

The hashes name blocks in the prefix cache and, as signed 64-bit ints, in the KV events routers
keep; packing the tokens in one struct.pack (issue 39, item 2: hashing was ~5% of a serving
core's step) must not change one of them. The reference is the encoding it replaced, written
out: each token as 4 little-endian unsigned bytes.
"""

from __future__ import annotations

import random
import struct

import pytest
from blake3 import blake3

from trtllm_gateway.engine.builtin.block_manager import block_hash, block_hashes


def _reference(prev: bytes, tokens: list[int], extra: bytes = b"") -> bytes:
    h = blake3(prev)
    h.update(b"".join(t.to_bytes(4, "little", signed=False) for t in tokens))
    h.update(extra)
    return h.digest(length=16)


def test_hashes_equal_the_per_token_encoding() -> None:
    rng = random.Random(7)
    prev = b""
    for n in (1, 16, 16, 32, 3):
        tokens = [
            rng.choice([0, 1, 255, 256, 2**31, 2**32 - 1, rng.randrange(2**32)]) for _ in range(n)
        ]
        for extra in (b"", b"img-hash"):
            assert block_hash(prev, tokens, extra) == _reference(prev, tokens, extra)
        prev = block_hash(prev, tokens)


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_an_id_outside_uint32_is_refused(bad: int) -> None:
    with pytest.raises(struct.error):  # to_bytes raised OverflowError: a refusal either way
        block_hash(b"", [1, bad])


@pytest.mark.parametrize("extra", [b"", b"img-hash"])
@pytest.mark.parametrize("n", [0, 15, 16, 17, 64 * 16, 64 * 16 + 5])
def test_block_hashes_chain_each_whole_block_as_block_hash_does(extra: bytes, n: int) -> None:
    """block_hashes packs a prompt's tokens once (the scheduler's admission, its prefix probe):
    the same chain of digests as block_hash a block at a time, whole blocks only, from prev."""
    rng = random.Random(n)
    tokens = [rng.randrange(2**32) for _ in range(n)]
    prev, want = b"parent", []
    for i in range(n // 16):
        prev = block_hash(prev, tokens[i * 16 : (i + 1) * 16], extra)
        want.append(prev)
    assert block_hashes(b"parent", tokens, 16, extra) == want
    parents = [b"parent", *want][: len(want)]
    for i, (parent, h) in enumerate(zip(parents, want, strict=True)):
        assert h == _reference(parent, tokens[i * 16 : (i + 1) * 16], extra)


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_block_hashes_refuse_an_id_outside_uint32(bad: int) -> None:
    with pytest.raises(struct.error):
        block_hashes(b"", [1] * 20 + [bad] + [1] * 11, 16)

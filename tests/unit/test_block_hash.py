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

from trtllm_gateway.engine.builtin.block_manager import block_hash


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

"""The sampler's keys computed over arrays (sampler._draw_on_device, issue 39's step loop) are the
scalar row_key's, bit for bit, at the edges of the 64-bit range too: a seeded request must draw
the same tokens whichever way its key was computed."""

from __future__ import annotations

import random

import numpy as np

from trtllm_gateway.engine.builtin.sample_keys import row_key, row_keys


def test_row_keys_equal_row_key() -> None:
    rng = random.Random(0)
    seeds = [0, 1, 2**63 - 1, 2**63, 2**64 - 1] + [rng.getrandbits(64) for _ in range(200)]
    steps = [0, 1, 5, 4095, 2**20] + [rng.randrange(1 << 20) for _ in range(200)]
    got = row_keys(np.array(seeds, dtype=np.uint64), np.array(steps, dtype=np.uint64))
    assert got.dtype == np.int64
    assert got.tolist() == [row_key(s, t) for s, t in zip(seeds, steps, strict=True)]
    assert (got >= 0).all()  # folded to int63: Philox takes it as a non-negative seed

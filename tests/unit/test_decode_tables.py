"""DecodeTables: the decode rows' block tables kept across steps equal the tables padded afresh.

A random walk over what a step can do to its decode rows (a table grows by appending, a list is
replaced by a shorter one, rows join, leave or move), each step compared with padded() of
the same rows, the fresh padding it replaces (issue 39, item 2).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from trtllm_gateway.engine.builtin.decode_tables import DecodeTables, padded
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.protocol import SamplingParams


def _seq(i: int, blocks: int) -> Sequence:
    s = Sequence(f"r{i}", [1, 2, 3], 3, SamplingParams(), torch.Generator())
    s.block_table = [1000 * i + b for b in range(blocks)]
    return s


def _fresh(seqs: list[Sequence]) -> np.ndarray:
    return padded([s.block_table_array() for s in seqs])


def test_kept_tables_equal_fresh_ones_through_a_random_walk() -> None:
    rng = random.Random(39)
    pool = [_seq(i, rng.randint(1, 6)) for i in range(40)]
    rows = pool[:12]
    tables = DecodeTables()
    kinds = set()
    for _ in range(400):
        kind = rng.choice(["same", "grow", "grow", "replace", "join", "leave", "move"])
        kinds.add(kind)
        if kind == "grow":
            for s in rng.sample(rows, k=min(3, len(rows))):
                s.block_table += [rng.randint(0, 10**6)] * rng.randint(1, 9)  # in place
        elif kind == "replace" and rows:
            s = rng.choice(rows)
            s.block_table = [rng.randint(0, 10**6) for _ in range(rng.randint(0, 3))]
        elif kind == "join":
            rows.insert(rng.randint(0, len(rows)), rng.choice(pool))
        elif kind == "leave" and rows:
            rows.pop(rng.randrange(len(rows)))
        elif kind == "move" and len(rows) > 1:
            rows.append(rows.pop(0))
        got = tables.of(rows)
        want = _fresh(rows) if rows else np.zeros((0, 1), dtype=np.int32)
        assert got.dtype == np.int32
        assert got.shape == want.shape, kind
        assert np.array_equal(got, want), kind
        got[:] = -7  # a caller's copy: writing it changes nothing kept
    assert kinds == {"same", "grow", "replace", "join", "leave", "move"}


def test_a_grown_row_is_written_in_place_without_a_rebuild() -> None:
    rows = [_seq(i, 3) for i in range(4)]
    tables = DecodeTables()
    tables.of(rows)
    kept = tables._arr
    rows[2].block_table += [77]
    out = tables.of(rows)
    assert tables._arr is kept  # the same array, one row's new block written
    assert out[2].tolist() == [2000, 2001, 2002, 77]
    assert out[0].tolist() == [0, 1, 2, 0]

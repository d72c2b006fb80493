"""DecodeGraphs' inputs: host_inputs() then load() put each field where the captured graph reads
it (cuda_graph.py's layout), with the tables at their own width, on CPU tensors.

The graph itself needs CUDA (tests/gpu/test_greedy_equivalence.py replays it against a float32
reference); this pins the layout the replay depends on: ids, positions, slots, context lengths
n entries each (n the largest bucket), padding rows with slot -1 and context 0, and the block
tables [b, width] written into the [n, max_blocks] table without touching the columns past it.
"""

from __future__ import annotations

import numpy as np
import torch

from trtllm_gateway.engine.builtin.cuda_graph import INPUTS, DecodeGraphs


def _graphs(n: int, max_blocks: int) -> DecodeGraphs:
    g = object.__new__(DecodeGraphs)  # the buffers alone: no model, no capture, no CUDA
    g.max_batch_size, g.max_blocks = n, max_blocks
    g.packed = torch.zeros(INPUTS * n + n * max_blocks, dtype=torch.int32)
    g.block_tables = g.packed[INPUTS * n :].view(n, max_blocks)
    return g


def test_inputs_land_where_the_graph_reads_them() -> None:
    n, max_blocks, b = 16, 10, 8
    g = _graphs(n, max_blocks)
    g.block_tables[:, 6:] = 99  # columns past this step's width: left as they were
    ids = np.array([5, -2, 7], dtype=np.int64)
    pos = np.array([40, 3, 17], dtype=np.int64)
    slots = np.array([640, 51, 273], dtype=np.int64)
    tables = np.array([[1, 2, 3], [4, 0, 0], [5, 6, 0]], dtype=np.int32)
    host = g.host_inputs(b, ids, pos, slots, tables)
    assert host.dtype == np.int32 and host.size == INPUTS * n + b * 3
    g.load(torch.from_numpy(host), b)
    p = g.packed
    assert p[:b].tolist() == [5, -2, 7, 0, 0, 0, 0, 0]
    assert p[n : n + 3].tolist() == [40, 3, 17]
    assert p[2 * n : 2 * n + b].tolist() == [640, 51, 273, -1, -1, -1, -1, -1]
    assert p[3 * n : 3 * n + b].tolist() == [41, 4, 18, 0, 0, 0, 0, 0]
    assert g.block_tables[:3, :3].tolist() == tables.tolist()
    assert g.block_tables[3:b, :3].abs().sum() == 0
    assert bool((g.block_tables[:, 6:] == 99).all())

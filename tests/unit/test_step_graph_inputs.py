"""StepGraphs' metadata (engine/builtin/step_graph.py): host_meta() then load() put a mixed step's
decode context lengths, prompt chunks, prefill tiles and block tables where the captured graph's
attention kernels read them, on CPU tensors.

The graph itself needs CUDA (tests/gpu/test_step_graph.py checks every whole-graph step against
the pieces bit for bit); this pins the layout the replay depends on: padding decode rows with
context 0, the tiles prefill_tiles would make followed by spare tiles on the spare row (context
0, no queries), and the tables written at their own widths without touching the columns past them.
"""

from __future__ import annotations

import numpy as np
import torch

from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.step_graph import PREFILLS, StepGraphs

BLOCK_M = 64  # kernels/prefill_attention.py's (it imports Triton)


def _graphs(max_decodes: int, max_blocks: int, sizes: list[int]) -> StepGraphs:
    g = object.__new__(StepGraphs)  # the buffers alone: no pieces, no capture, no CUDA
    g.block_m = BLOCK_M
    g.sizes = sizes
    g.decodes = {b: min(b, max_decodes) for b in sizes}
    g.tiles = {b: b // BLOCK_M + min(b, PREFILLS) for b in sizes}
    g.splits = dict.fromkeys(sizes, 1)
    g.hides = 1000
    g.buffers(max_decodes, max(g.tiles.values()), max_blocks, torch.device("cpu"))
    return g


def _batch(positions: list[int], d_tables: list[list[int]], q_lens: list[int]) -> StepBatch:
    nd = len(d_tables)
    tokens = nd + sum(q_lens)
    starts = nd + np.concatenate([[0], np.cumsum(q_lens)[:-1]]).astype(np.int32)
    width = max((len(t) for t in d_tables), default=1)
    return StepBatch(
        chunks=(),
        token_ids=np.zeros(tokens, dtype=np.int64),
        positions=np.array(positions + [0] * (tokens - nd), dtype=np.int64),
        slots=np.zeros(tokens, dtype=np.int64),
        num_decodes=nd,
        decode_tables=np.array([t + [0] * (width - len(t)) for t in d_tables], dtype=np.int32)
        if nd
        else np.zeros((0, 1), dtype=np.int32),
        prefill_q_starts=starts if q_lens else np.zeros(0, dtype=np.int32),
        prefill_q_lens=np.array(q_lens, dtype=np.int32),
        prefill_ctx_lens=np.array([n + 100 for n in q_lens], dtype=np.int32),
        prefill_tables=np.array([[7 + i, 8 + i, 9 + i] for i in range(len(q_lens))], dtype=np.int32)
        if q_lens
        else np.zeros((0, 1), dtype=np.int32),
        sample_rows=np.zeros(0, dtype=np.int64),
        sample_seqs=(),
        prompt_logprobs=(),
        images=(),
        placeholders=False,
    )


def _reference_tiles(q_lens: list[int]) -> list[list[int]]:
    """prefill_attention.prefill_tiles' pairs: one a BLOCK_M tile of each chunk's queries."""
    return [[row, m0] for row, n in enumerate(q_lens) for m0 in range(0, n, BLOCK_M)]


def test_metadata_lands_where_the_graph_reads_it() -> None:
    g = _graphs(max_decodes=8, max_blocks=6, sizes=[32, 64, 256])
    g.decode_tables[:, 4:] = 99  # columns past this step's width: left as they were
    g.prefill_tables[:, 4:] = 99
    g.head[:] = 55  # a larger bucket's stale state
    batch = _batch([40, 3], [[1, 2, 3], [4]], [130, 17, 64])
    b = 256
    host = g.host_meta(b, batch)
    g.load(torch.from_numpy(host), b, batch)
    d = g.decodes[b]
    meta = g.head
    assert meta[:d].tolist() == [41, 4, 0, 0, 0, 0, 0, 0]  # padding rows attend to nothing
    pf = meta[g._pf : g._tiles].view(3, PREFILLS + 1)
    assert pf[0, :4].tolist() == [230, 117, 164, 0]
    assert pf[1, :3].tolist() == [2, 132, 149]
    assert pf[2, :4].tolist() == [130, 17, 64, 0]
    assert pf[:, PREFILLS].abs().sum() == 0  # the spare row
    tiles = meta[g._tiles : g._tiles + 2 * g.tiles[b]].view(-1, 2).tolist()
    want = _reference_tiles([130, 17, 64])
    assert tiles[: len(want)] == want
    assert tiles[len(want) :] == [[PREFILLS, 0]] * (g.tiles[b] - len(want))
    assert g.decode_tables[:2, :3].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert g.prefill_tables[:3, :3].tolist() == [[7, 8, 9], [8, 9, 10], [9, 10, 11]]
    assert bool((g.decode_tables[:, 4:] == 99).all())
    assert bool((g.prefill_tables[:, 4:] == 99).all())


def test_a_step_of_prompts_alone_or_decodes_alone() -> None:
    g = _graphs(max_decodes=4, max_blocks=6, sizes=[32, 128])
    prompts = _batch([], [], [100])
    g.load(torch.from_numpy(g.host_meta(128, prompts)), 128, prompts)
    assert g.head[: g.decodes[128]].abs().sum() == 0
    tiles = g.head[g._tiles : g._tiles + 2 * g.tiles[128]].view(-1, 2).tolist()
    assert tiles[:2] == [[0, 0], [0, 64]] and tiles[2] == [PREFILLS, 0]
    decodes = _batch([5, 6, 7], [[1], [2], [3]], [])
    g.load(torch.from_numpy(g.host_meta(32, decodes)), 32, decodes)
    assert g.head[:4].tolist() == [6, 7, 8, 0]
    assert g.head[g._pf : g._tiles].view(3, -1)[2].abs().sum() == 0  # no queries
    tiles = g.head[g._tiles : g._tiles + 2 * g.tiles[32]].view(-1, 2).tolist()
    assert tiles == [[PREFILLS, 0]] * g.tiles[32]


def test_every_step_of_at_most_prefills_chunks_fits_its_bucket() -> None:
    """T(b) = b // 64 + PREFILLS tiles hold any step of at most PREFILLS chunks in b tokens;
    a step of more chunks is left to the pieces."""
    rng = np.random.default_rng(0)
    g = _graphs(max_decodes=64, max_blocks=4, sizes=[32, 64, 128, 2048])
    for _ in range(200):
        b = int(rng.choice(g.sizes))
        p = int(rng.integers(1, min(b, PREFILLS) + 1))
        cuts = np.sort(rng.choice(np.arange(1, b), size=p - 1, replace=False)) if p > 1 else []
        q_lens = np.diff(np.concatenate([[0], cuts, [b]])).astype(int).tolist()
        assert len(_reference_tiles(q_lens)) <= g.tiles[b]
        batch = _batch([], [], q_lens)
        assert g.takes(batch, b, 1)
        tiles = g.host_meta(b, batch)[g._tiles : g._tiles + 2 * g.tiles[b]].reshape(-1, 2)
        assert tiles[: len(_reference_tiles(q_lens))].tolist() == _reference_tiles(q_lens)
    assert not g.takes(_batch([], [], [1] * (PREFILLS + 1)), 64, 1)


def test_decodes_wanting_more_splits_take_the_graph_only_in_a_small_step() -> None:
    """A step whose decodes want more splits than its bucket's graph runs them at replays the
    pieces once its GEMMs hide the launches (hides tokens), and the whole graph below that."""
    g = _graphs(max_decodes=64, max_blocks=40, sizes=[128, 2048])
    g.splits = {128: 1, 2048: 1}
    g.hides = 600
    small = _batch([500] * 4, [[1] * 32] * 4, [100])
    large = _batch([500] * 4, [[1] * 32] * 4, [1000])
    assert g.takes(small, 128, 1) and g.takes(large, 2048, 1)
    assert g.takes(small, 128, 9)  # 104 tokens: too few to hide the pieces' launches
    assert not g.takes(large, 2048, 9)

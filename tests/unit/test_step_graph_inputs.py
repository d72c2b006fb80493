"""StepGraphs on the CPU (engine/builtin/step_graph.py): host_meta() then load() put a mixed step's
decode context lengths, prompt chunks, prefill tiles and block tables where the captured graph's
attention kernels read them; and a whole step run through those buffers, with attention that
follows the kernels' launch shapes (every padded decode row, every tile), gives the hidden states
and the KV cache of LlamaModel's fused path.

The graphs need CUDA (tests/gpu/test_step_graph.py checks every whole-graph step against the
pieces bit for bit); here the step is called where the graph would be replayed, and the kernels
are TiledOps: plain torch that launches as the kernels do. A decode row of context 0 gets zeros
(kernels/decode_attention.py: acc and den stay 0, `acc * (v_scale / max(den, 1e-30))`); a
prefill tile (seq, m0) computes the BLOCK_M queries from m0 that the chunk has
(prefill_attention.py: `imask = i < qn`), so a tile on the spare row (no queries) writes nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.unit.test_piecewise_pieces import CFG, PAGE, TorchOps, _caches
from trtllm_gateway.engine.builtin.attention import AttentionMetadata, KernelPrefill
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.model_config import ModelConfig
from trtllm_gateway.engine.builtin.piecewise_graph import PiecewiseGraphs
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.step_graph import PREFILLS, StepGraphs

BLOCK_M = 64  # kernels/prefill_attention.py's (it imports Triton)


def _graphs(max_decodes: int, max_blocks: int, max_tokens: int, slots: int = 64) -> StepGraphs:
    cfg = ModelConfig.from_dict(CFG)
    model = LlamaModel(cfg, 256).eval()
    model.ops = TiledOps(PAGE)  # type: ignore[assignment]
    pw = PiecewiseGraphs(model, _caches(cfg, slots), max_tokens, max_prev=max_decodes)
    return StepGraphs(pw, max_decodes, max_blocks, lambda rows: 1, BLOCK_M)


def _batch(
    positions: list[int],
    d_tables: list[list[int]],
    q_lens: list[int],
    ctx: list[int] | None = None,
    p_tables: list[list[int]] | None = None,
    ids: list[int] | None = None,
) -> StepBatch:
    nd = len(d_tables)
    tokens = nd + sum(q_lens)
    starts = nd + np.concatenate([[0], np.cumsum(q_lens)[:-1]]).astype(np.int32)
    width = max((len(t) for t in d_tables), default=1)
    ctx = ctx if ctx is not None else [n + 100 for n in q_lens]
    p_tables = p_tables or [[7 + i, 8 + i, 9 + i] for i in range(len(q_lens))]
    p_pos = [np.arange(c - n, c) for c, n in zip(ctx, q_lens, strict=True)]
    pos = np.concatenate([np.array(positions, dtype=np.int64), *p_pos]).astype(np.int64)
    rows = [*d_tables, *(t for t, n in zip(p_tables, q_lens, strict=False) for _ in range(n))]
    # A row's slot where its table reaches its position (the layout tests' tables are short).
    slots = np.array(
        [
            t[p // PAGE] * PAGE + p % PAGE if p // PAGE < len(t) else -1
            for t, p in zip(rows, pos, strict=True)
        ]
    )
    return StepBatch(
        packed_chunks=(),
        token_ids=np.asarray(ids if ids is not None else np.zeros(tokens), dtype=np.int64),
        positions=pos,
        slots=slots.astype(np.int64),
        num_decodes=nd,
        decode_tables=np.array([t + [0] * (width - len(t)) for t in d_tables], dtype=np.int32)
        if nd
        else np.zeros((0, 1), dtype=np.int32),
        prefill_q_starts=starts if q_lens else np.zeros(0, dtype=np.int32),
        prefill_q_lens=np.array(q_lens, dtype=np.int32),
        prefill_ctx_lens=np.array(ctx, dtype=np.int32),
        prefill_tables=np.array(p_tables, dtype=np.int32) if q_lens else np.zeros((0, 1), np.int32),
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
    g = _graphs(max_decodes=8, max_blocks=6, max_tokens=256)
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
    g = _graphs(max_decodes=4, max_blocks=6, max_tokens=128)
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
    g = _graphs(max_decodes=64, max_blocks=4, max_tokens=2048)
    for _ in range(200):
        b = int(rng.choice(g.sizes))
        p = int(rng.integers(1, min(b, PREFILLS) + 1))
        cuts = np.sort(rng.choice(np.arange(1, b), size=p - 1, replace=False))
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
    g = _graphs(max_decodes=64, max_blocks=40, max_tokens=2048)
    g.hides = 600
    small = _batch([500] * 4, [[1] * 32] * 4, [100])
    large = _batch([500] * 4, [[1] * 32] * 4, [1000])
    assert g.takes(small, 128, 1) and g.takes(large, 1024, 1)
    assert g.takes(small, 128, 9)  # 104 tokens: too few to hide the pieces' launches
    assert not g.takes(large, 1024, 9)


class TiledOps(TorchOps):
    """TorchOps whose attention launches as the kernels do (module docstring)."""

    def attention(
        self,
        q: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        scale: float,
        kv_scales: tuple[float, float] = (1.0, 1.0),
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = torch.empty_like(q) if out is None else out
        tables, lens = meta.decode_block_tables, meta.decode_ctx_lens
        for r in range(meta.num_decodes):
            assert tables is not None and lens is not None
            ctx = int(lens[r])
            if ctx == 0:
                out[r] = 0.0
            else:
                out[r : r + 1] = self._one(q[r : r + 1], kv, tables[r], ctx, scale)
        pf = meta.prefill
        if pf is not None:
            for seq, m0 in pf.tiles.view(-1, 2).tolist():
                ctx, q0, qn = int(pf.ctx_lens[seq]), int(pf.q_starts[seq]), int(pf.q_lens[seq])
                hi = min(m0 + BLOCK_M, qn)
                if hi > m0:
                    rows = slice(q0 + m0, q0 + hi)
                    first = ctx - qn + m0  # the tile's first query's position
                    table = pf.block_tables[seq]
                    out[rows] = self._one(q[rows], kv, table, ctx, scale, first)
        return out


class _Step:
    """The whole step called where its CUDA graph would be replayed."""

    def __init__(self, g: StepGraphs, b: int) -> None:
        self.g, self.b = g, b

    def replay(self) -> None:
        self.g._step(self.b)


@torch.inference_mode()
def test_a_whole_step_through_the_static_buffers_equals_the_fused_path() -> None:
    """Three decodes (their ids placeholders for the previous step's samples) and two prompt
    chunks, one of two tiles: 83 rows in bucket 128, whose 8 decode rows reach into the prompt
    rows (zeros there, then the prefill tiles' output) and whose spare tiles write nothing."""
    torch.manual_seed(0)
    g = _graphs(max_decodes=8, max_blocks=20, max_tokens=128, slots=48 * PAGE)
    pw, model = g.pieces, g.pieces.model
    cfg = model.cfg
    d_tables, lens = [[3, 7, 11], [1, 2, 9, 15], [4, 13]], [9, 14, 5]
    p_tables = [list(range(16, 35)), [*range(35, 43), *[0] * 11]]  # 76 and 30 tokens of context
    q_lens, ctx = [70, 10], [76, 30]
    prompt = torch.randint(0, cfg.vocab_size, (80,)).tolist()
    batch = _batch([n - 1 for n in lens], d_tables, q_lens, ctx, p_tables, [-2, -4, -1, *prompt])
    prev = torch.tensor([17, 250, 42, 99])  # the previous step's samples
    tokens = len(batch.token_ids)
    raw = torch.from_numpy(batch.token_ids)
    positions, slots = torch.from_numpy(batch.positions), torch.from_numpy(batch.slots)

    eager_kv = _caches(cfg, 48 * PAGE)  # the same seed as the pieces' caches
    meta = AttentionMetadata(
        slot_mapping=slots,
        num_decodes=3,
        decode_block_tables=torch.from_numpy(batch.decode_tables),
        decode_ctx_lens=torch.tensor(lens, dtype=torch.int32),
        prefill=KernelPrefill(
            block_tables=torch.tensor(p_tables, dtype=torch.int32),
            ctx_lens=torch.tensor(ctx, dtype=torch.int32),
            q_starts=torch.tensor([3, 73], dtype=torch.int32),
            q_lens=torch.tensor(q_lens, dtype=torch.int32),
            tiles=torch.tensor(_reference_tiles(q_lens), dtype=torch.int32).flatten(),
        ),
    )
    ids = torch.where(raw < 0, prev[(-raw - 1).clamp(min=0)], raw)
    want = model(ids, positions, eager_kv, meta)

    b = pw.bucket(tokens)
    assert b == 128 and g.takes(batch, b, 1) and g.decodes[b] == 8
    host = pw.host_inputs(b, batch.token_ids, batch.positions, batch.slots)
    pw.load(torch.from_numpy(host), b, prev)
    g.head[:] = 3  # a bigger step's metadata left behind: the step must overwrite what it reads
    g.load(torch.from_numpy(g.host_meta(b, batch)), b, batch)
    g.graphs[b] = _Step(g, b)  # type: ignore[assignment]
    got = g.replay(b, tokens)

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert g.replays == 1
    for (ke, ve), (kp, vp) in zip(eager_kv, pw.kv_caches, strict=True):
        torch.testing.assert_close(kp, ke, rtol=1e-5, atol=1e-5)  # padding rows wrote nothing
        torch.testing.assert_close(vp, ve, rtol=1e-5, atol=1e-5)

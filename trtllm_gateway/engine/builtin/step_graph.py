"""StepGraphs: one CUDA graph of a whole mixed step, its attentions included, at every bucket of
the piecewise graphs.

PiecewiseGraphs replays the work between a step's attentions and launches the attentions
eagerly: the decode kernel and the prefill kernel in every layer, ~60 Triton launches for a
30-layer model at ~80 us of the host's time each on a 16-core H200 host. A 135M mixed step spent
~6 ms of host time in forward whatever its size (issue 39, StepClock by kind, 2026-11-28), while
its GPU work took less. Here the attentions' launch shapes are fixed per bucket b, so the whole
step replays as one graph:

- decodes: decode_attention over D(b) = min(b, max decodes) rows at a split count fixed per bucket
  (choose_splits for D(b) rows at the longest context, as DecodeGraphs does). Rows past the
  step's decodes have context 0 and write zeros; where those rows are the step's prompt rows the
  prefill kernel, launched after it, writes them again.
- prompt chunks: prefill_attention over T(b) = b // 64 + PREFILLS tiles (64: its BLOCK_M).
  A step of at most PREFILLS chunks has no more tiles than that (each chunk adds at most one
  partial tile); the tiles past the step's point at a spare row of context 0 and no queries,
  which reads nothing and writes nothing.

The metadata sits in static buffers that each step fills at its own widths: one upload, three
device copies. A step of more than PREFILLS chunks replays the pieces as before, and so does a
step whose decodes want more splits than its bucket's while its GEMMs hide the pieces' launches
(takes). Kernels, GEMM
row counts and the pieces' buffers are the piecewise path's, so both give the same hidden
states when the decodes run at the same split count (tests/gpu/test_piecewise_graph.py checks
every whole-graph step against the pieces, bit for bit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from trtllm_gateway.engine.builtin.attention import AttentionMetadata, KernelPrefill
from trtllm_gateway.engine.builtin.capture_gc import no_collection
from trtllm_gateway.engine.builtin.piecewise_graph import PiecewiseGraphs, hiding_tokens
from trtllm_gateway.engine.builtin.step_batch import StepBatch

logger = logging.getLogger(__name__)

# Most prompt chunks a whole-step graph takes. 1,024-token prompts under an 8,192-token budget
# fit at most 9 in a step (8 whole and a part); more is a burst of short prompts, which the
# pieces still run. Each spare tile is a program that exits at once.
PREFILLS = 32


class StepGraphs:
    def __init__(
        self,
        pieces: PiecewiseGraphs,
        max_decodes: int,
        max_blocks: int,
        splits_for: Callable[[int], int],
        block_m: int,
    ) -> None:
        """splits_for(rows): the decode kernel's split count for that many rows at the longest
        context (the backend's choose_splits); block_m: the prefill kernel's queries a tile."""
        self.pieces = pieces
        self.sizes = pieces.sizes
        self.block_m = block_m
        self.decodes = {b: min(b, max_decodes) for b in self.sizes}
        self.tiles = {b: b // block_m + min(b, PREFILLS) for b in self.sizes}
        self.splits = {b: splits_for(d) for b, d in self.decodes.items()}
        self.hides = hiding_tokens(pieces.model.cfg)
        dev = pieces.inputs.device
        self.buffers(max_decodes, max(self.tiles.values()), max_blocks, dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0  # steps run as one graph (tests, benchmarks)

    def buffers(self, max_decodes: int, max_tiles: int, max_blocks: int, dev: torch.device) -> None:
        """The static metadata. head: decode context lengths [max_decodes] | prefill ctx_len,
        q_start, q_len [3, PREFILLS + 1] (column PREFILLS stays 0: the spare row) | tiles
        [max_tiles, 2]; then the decode and prefill block tables at max_blocks columns."""
        self._pf = max_decodes
        self._tiles = self._pf + 3 * (PREFILLS + 1)
        self.head = torch.zeros(self._tiles + 2 * max_tiles, dtype=torch.int32, device=dev)
        self.decode_tables = torch.zeros((max_decodes, max_blocks), dtype=torch.int32, device=dev)
        self.prefill_tables = torch.zeros((PREFILLS + 1, max_blocks), dtype=torch.int32, device=dev)

    def takes(self, batch: StepBatch, b: int, splits: int) -> bool:
        """At most PREFILLS prompt chunks and tables that fit the static ones; and decodes that
        want no more splits than the bucket's (splits: the step's own choose_splits), unless the
        step is too small for its GPU work to hide the pieces' eager launches (hiding_tokens).
        At one split a few decodes over long contexts leave most SMs idle in the decode
        attention (an 8B model's 4 decodes: 32 programs where the step would launch 9 splits
        of each), time a large prompt chunk's step would spend on the GPU; a small step's saved
        launches are worth more."""
        w = self.decode_tables.shape[1]
        return (
            len(batch.prefill_q_lens) <= PREFILLS
            and batch.decode_tables.shape[1] <= w
            and batch.prefill_tables.shape[1] <= w
            and (splits <= self.splits[b] or len(batch.token_ids) < self.hides)
        )

    def host_meta(self, b: int, batch: StepBatch) -> np.ndarray:
        """int32: `head` as the step fills it, then its decode tables and prefill tables at their
        own widths. load() puts it in place."""
        nd, p = batch.num_decodes, len(batch.prefill_q_lens)
        dt, pt = batch.decode_tables, batch.prefill_tables
        head = self._tiles + 2 * self.tiles[b]
        host = np.zeros(head + dt[:nd].size + pt.size, dtype=np.int32)
        host[:nd] = batch.decode_ctx_lens
        pf = host[self._pf : self._tiles].reshape(3, PREFILLS + 1)
        pf[0, :p] = batch.prefill_ctx_lens
        pf[1, :p] = batch.prefill_q_starts
        pf[2, :p] = batch.prefill_q_lens
        tiles = host[self._tiles : head].reshape(-1, 2)
        tiles[:, 0] = PREFILLS  # the spare row
        bm = self.block_m
        per = -(-batch.prefill_q_lens // bm)
        rows = np.repeat(np.arange(p, dtype=np.int32), per)
        tiles[: len(rows), 0] = rows
        starts = np.arange(len(rows), dtype=np.int32) - np.repeat(np.cumsum(per) - per, per)
        tiles[: len(rows), 1] = starts * bm
        host[head : head + dt[:nd].size] = dt[:nd].ravel()
        host[head + dt[:nd].size :] = pt.ravel()
        return host

    def load(self, meta: torch.Tensor, b: int, batch: StepBatch) -> None:
        """host_meta(b, batch) as uploaded."""
        nd, p = batch.num_decodes, len(batch.prefill_q_lens)
        head = self._tiles + 2 * self.tiles[b]
        self.head[:head].copy_(meta[:head])
        if nd:
            w = batch.decode_tables.shape[1]
            self.decode_tables[:nd, :w].copy_(meta[head : head + nd * w].view(nd, w))
        if p:
            w = batch.prefill_tables.shape[1]
            tables = meta[head + nd * batch.decode_tables.shape[1] :]
            self.prefill_tables[:p, :w].copy_(tables.view(p, w))

    def meta(self, b: int) -> AttentionMetadata:
        """Bucket b's attention metadata: views of the static buffers."""
        d, h = self.decodes[b], self.head
        pf = h[self._pf : self._tiles].view(3, PREFILLS + 1)
        return AttentionMetadata(
            slot_mapping=self.pieces.slots[:b],
            num_decodes=d,
            decode_ctx_lens=h[:d],
            decode_block_tables=self.decode_tables[:d],
            decode_splits=self.splits[b],
            prefill=KernelPrefill(
                block_tables=self.prefill_tables,
                ctx_lens=pf[0],
                q_starts=pf[1],
                q_lens=pf[2],
                tiles=h[self._tiles : self._tiles + 2 * self.tiles[b]],
            ),
        )

    def _step(self, b: int) -> None:
        pw = self.pieces
        ops = pw.model.ops
        assert ops is not None
        meta = self.meta(b)
        layers = pw.model.decoder_layers
        for k, (layer, kv) in enumerate(zip(layers, pw.kv_caches, strict=True)):
            pw.piece(b, k)
            at = layer.self_attn
            ops.attention(pw.q[:b], kv, meta, at.scale, at.kv_scales, out=pw.o[:b])
        pw.piece(b, len(layers))

    def replay(self, b: int, tokens: int) -> torch.Tensor:
        """The step's hidden states [tokens, hidden], as PiecewiseGraphs.run gives them; the
        pieces' inputs and this step's metadata must be loaded."""
        self.graphs[b].replay()
        self.replays += 1
        return self.pieces.hidden[:tokens]

    @torch.inference_mode()
    def capture(self) -> None:
        """Every bucket's graph, largest first, into the pieces' memory pool (a step runs either
        its pieces or its whole graph, and both keep what outlives them in the pieces' static
        buffers). Capturing reads padding: slot -1, context 0, the spare prefill row."""
        t0 = time.perf_counter()
        pool = self.pieces.graphs[self.sizes[-1]][0].pool()  # the first piece captured made it
        with no_collection():  # capture_gc.py: no collection mid-capture
            for b in reversed(self.sizes):
                self._step(b)  # warm-up: compiles this bucket's split count and grid
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    self._step(b)
                self.graphs[b] = g
        torch.cuda.synchronize()
        logger.info(
            "captured %d whole mixed-step graphs in %.1fs",
            len(self.graphs),
            time.perf_counter() - t0,
        )

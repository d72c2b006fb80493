"""DecodeGraphs: CUDA graphs of the whole decode step (embedding to logits) at bucketed batch sizes.

A step's inputs go into one static int32 buffer (`packed`), uploaded in one piece and put in
place by two device copies: token ids, positions, slots, context lengths (n each, n the largest
bucket) and the block tables [n, max_blocks] (written at the step's own width). The graph widens
what needs int64 and swaps each placeholder -(r + 1) for row r of `prev` (the previous step's
sampled ids, copied in on the device), so a replay is one upload, three device copies and the
graph, not a dozen launches (issue 39, item 2). The graph ends by sampling every row (the
sampling kernel, on the keys and temperatures set_draws put in place, zeros: greedy), so a step
whose rows all draw straight from the logits launches nothing else. A batch is padded to the
next captured size with rows that write no KV (slot -1) and attend to nothing (context 0).
Graphs are captured largest first into one memory pool. The split-KV count of each bucket is
fixed at capture time from the longest context.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from trtllm_gateway.engine.builtin.attention import AttentionMetadata
from trtllm_gateway.engine.builtin.capture_gc import no_collection
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.pinned_ring import PinnedRing

logger = logging.getLogger(__name__)

INPUTS = 4  # token ids, positions, slots, context lengths: n entries each, then the tables


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch_size]
    sizes += list(range(16, max_batch_size + 1, 16))
    if sizes[-1] != max_batch_size:
        sizes.append(max_batch_size)
    return sizes


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_batch_size: int,
        max_blocks: int,
        max_model_len: int,
        page: int,
    ) -> None:
        dev = model.embed_tokens.weight.device
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = graph_batch_sizes(max_batch_size)
        self.max_batch_size = self.sizes[-1]
        n = self.max_batch_size
        self.max_blocks = max_blocks
        self.packed = torch.zeros(INPUTS * n + n * max_blocks, dtype=torch.int32, device=dev)
        self.packed[2 * n : 3 * n] = -1  # slots: padding rows write no KV
        self.prev = torch.zeros(n, dtype=torch.long, device=dev)  # placeholders' ids
        self.block_tables = self.packed[INPUTS * n :].view(n, max_blocks)
        # In the model's dtype, written by the lm_head's GEMM itself: its float copy and the
        # copy of that into this buffer were 61 us of a 2.38 ms step (135M at 256 running,
        # H200, 2026-11-29); the sampling kernel reads 16-bit logits as they are.
        w = model.lm_head.weight
        self.logits = torch.zeros((n, model.cfg.vocab_size), dtype=w.dtype, device=dev)
        # The sampling kernel's inputs (sampler.Draws: temperature 0 is greedy) and, by bucket,
        # its ids, which live in the graphs' pool.
        self.temps = torch.zeros(n, dtype=torch.float32, device=dev)
        self.keys = torch.zeros(n, dtype=torch.int64, device=dev)
        self._drawing = False  # temps hold a sampled step's temperatures, not zeros
        self._ids: dict[int, torch.Tensor] = {}
        from trtllm_gateway.engine.builtin.kernels.decode_attention import (  # Triton
            choose_splits,
            takes_all_heads,
        )

        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        dtype, hk = model.embed_tokens.weight.dtype, model.cfg.num_kv_heads
        heads = takes_all_heads(model.cfg.num_heads, dtype, *kv_caches[0], page)
        self.splits = {b: choose_splits(b, hk, max_model_len, page, sms, heads) for b in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def bucket(self, n: int) -> int | None:
        for b in self.sizes:
            if b >= n:
                return b
        return None

    def host_inputs(
        self,
        b: int,
        token_ids: np.ndarray,
        positions: np.ndarray,
        slots: np.ndarray,
        tables: np.ndarray,
    ) -> np.ndarray:
        """The first len(token_ids) rows of bucket b, int32 (slots < 2^31: one per KV token):
        `packed`'s first INPUTS * n entries, then the tables [b, their width]; the rest of the
        bucket pads (slot -1, context 0). load() puts it in place."""
        n, rows, width = self.max_batch_size, len(token_ids), tables.shape[1]
        host = np.zeros(INPUTS * n + b * width, dtype=np.int32)
        host[:rows] = token_ids
        host[n : n + rows] = positions
        host[2 * n : 3 * n] = -1
        host[2 * n : 2 * n + rows] = slots
        host[3 * n : 3 * n + rows] = positions + 1  # context lengths, the new token included
        host[INPUTS * n :].reshape(b, width)[:rows] = tables
        return host

    def load(self, inputs: torch.Tensor, b: int) -> None:
        """host_inputs(b, ...) as uploaded: two copies on the device. The tables go up at their
        own width, not max_blocks (at a long max_model_len that would be megabytes a step)."""
        head = INPUTS * self.max_batch_size
        width = (inputs.numel() - head) // b
        self.packed[:head].copy_(inputs[:head])
        self.block_tables[:b, :width].copy_(inputs[head:].view(b, width))

    def _step(self, b: int) -> None:
        from trtllm_gateway.engine.builtin.kernels.sampling import sample  # Triton

        n, p = self.max_batch_size, self.packed
        raw = p[:b].long()
        ids = torch.where(raw < 0, self.prev[(-raw - 1).clamp(0, n - 1)], raw)
        meta = AttentionMetadata(
            slot_mapping=p[2 * n : 2 * n + b].long(),
            num_decodes=b,
            decode_ctx_lens=p[3 * n : 3 * n + b],
            decode_block_tables=self.block_tables[:b],
            decode_splits=self.splits[b],
        )
        hidden = self.model(ids, p[n : n + b].long(), self.kv_caches, meta)
        self.model.logits_into(hidden, self.logits[:b])
        self._ids[b] = sample(self.logits[:b], self.temps[:b], self.keys[:b])

    @torch.inference_mode()
    def capture(self) -> None:
        t0 = time.perf_counter()
        pool = None
        with no_collection():  # capture_gc.py: no collection mid-capture
            for b in reversed(self.sizes):
                self._step(b)  # warm-up: compiles the Triton kernels, sets cuBLAS up
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    self._step(b)
                if pool is None:
                    pool = g.pool()
                self.graphs[b] = g
        torch.cuda.synchronize()
        logger.info(
            "captured %d decode graphs in %.1fs", len(self.graphs), time.perf_counter() - t0
        )

    def set_draws(self, packed: np.ndarray | None, rows: int, ring: PinnedRing) -> None:
        """The next replay's keys and temperatures for its first `rows` rows: sampler.Draws'
        packed bytes (keys, then temperatures), or None for every row greedy (zeros). Rows
        past them (a bucket's padding) sample whatever they hold: their ids are never read."""
        if packed is None:
            if self._drawing:
                self.temps.zero_()
                self._drawing = False
            return
        up = ring.upload(packed, torch.uint8)
        self.keys[:rows].copy_(up[: 8 * rows].view(torch.int64))
        self.temps[:rows].copy_(up[8 * rows :].view(torch.float32))
        self._drawing = True

    def sampled(self, b: int, rows: int) -> torch.Tensor:
        """The ids the last replay of bucket b drew for its first `rows` rows (a view of the
        graph's own buffer: valid, in stream order, until that bucket replays again)."""
        return self._ids[b][:rows]

    def replay(self, b: int) -> torch.Tensor:
        """Inputs for the first b rows must already be in `packed` (and `prev`). Returns
        logits[:b], in the model's dtype."""
        self.graphs[b].replay()
        return self.logits[:b]

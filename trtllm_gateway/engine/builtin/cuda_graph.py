"""DecodeGraphs: CUDA graphs of the whole decode step (embedding to logits) at bucketed batch sizes.

Static input buffers (token ids, positions, slots, context lengths, block tables) are filled
before each replay; a batch is padded to the next captured size with rows that write no KV
(slot -1) and attend to nothing (context 0). Graphs are captured largest first into one memory
pool. The split-KV count of each bucket is fixed at capture time from the longest context.
"""

from __future__ import annotations

import logging
import time

import torch

from trtllm_gateway.engine.builtin.attention import AttentionMetadata
from trtllm_gateway.engine.builtin.kernels.decode_attention import choose_splits
from trtllm_gateway.engine.builtin.model import LlamaModel

logger = logging.getLogger(__name__)


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
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slots = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.ctx_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros((n, max_blocks), dtype=torch.int32, device=dev)
        self.logits = torch.zeros((n, model.cfg.vocab_size), dtype=torch.float32, device=dev)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self.splits = {
            b: choose_splits(b, model.cfg.num_kv_heads, max_model_len, page, sms)
            for b in self.sizes
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def bucket(self, n: int) -> int | None:
        for b in self.sizes:
            if b >= n:
                return b
        return None

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slots[:b],
            num_decodes=b,
            decode_ctx_lens=self.ctx_lens[:b],
            decode_block_tables=self.block_tables[:b],
            decode_splits=self.splits[b],
        )

    def _step(self, b: int, meta: AttentionMetadata) -> None:
        hidden = self.model(self.input_ids[:b], self.positions[:b], self.kv_caches, meta)
        self.logits[:b].copy_(self.model.compute_logits(hidden))

    @torch.inference_mode()
    def capture(self) -> None:
        t0 = time.perf_counter()
        pool = None
        for b in reversed(self.sizes):
            meta = self._meta(b)
            self._step(b, meta)  # warm-up: compiles the Triton kernels, sets cuBLAS up
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self._step(b, meta)
            if pool is None:
                pool = g.pool()
            self.graphs[b] = g
        torch.cuda.synchronize()
        logger.info(
            "captured %d decode graphs in %.1fs", len(self.graphs), time.perf_counter() - t0
        )

    def replay(self, b: int) -> torch.Tensor:
        """Inputs for the first b rows must already be in the static buffers. Returns logits[:b]."""
        self.graphs[b].replay()
        return self.logits[:b]

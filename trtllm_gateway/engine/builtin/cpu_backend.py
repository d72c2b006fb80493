"""CpuBackend: a StepBatch's forward on the portable path: SDPA attention and cpu_kernels/.

Decode rows attend over their blocks in one batched call (attention.py, or the compiled decode
kernel the loader sets); each prefill chunk attends on its own, with a causal mask offset by its
context when the chunk does not start at position 0. CPU only: the batch's numpy arrays become
tensors without a copy. The host computes the step, so nothing is
gained by resolving it later: its default overlap depth is 0 (depth 1 runs too, and the tests
run it: the placeholders are swapped here as TritonBackend swaps them on the GPU).
"""

from __future__ import annotations

import numpy as np
import torch

from trtllm_gateway.engine.builtin.attention import (
    AttentionMetadata,
    PrefillSpan,
    causal_offset_mask,
)
from trtllm_gateway.engine.builtin.backend import (
    KvCaches,
    fill_prompt_logprobs,
    resolve_placeholders,
)
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.sampler import Draws
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.vision.placeholders import merge_images


class CpuBackend:
    depth = 0
    takes_draws = False  # each row draws from its own generator (sampler._draw_on_host)

    def __init__(
        self, model: LlamaModel, kv_caches: KvCaches, block_size: int, device: torch.device
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self._offsets = torch.arange(block_size, device=device)

    @torch.inference_mode()
    def forward(
        self, batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        # The batch's int64 arrays as tensors without a copy (read only: the placeholders
        # resolve into a new tensor).
        ids = torch.from_numpy(batch.token_ids)
        if batch.placeholders:
            ids = resolve_placeholders(ids, prev)
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(batch.slots),
            num_decodes=batch.num_decodes,
            block_size=self.block_size,
        )
        if batch.num_decodes:
            self._decode_meta(meta, batch)
        for q_start, q_len, ctx_len, table in zip(
            batch.prefill_q_starts.tolist(),
            batch.prefill_q_lens.tolist(),
            batch.prefill_ctx_lens.tolist(),
            batch.prefill_tables,
            strict=True,
        ):
            full = ctx_len == q_len  # the chunk is the whole context: plain causal attention
            ctx = None if full else self._context_slots(table, ctx_len)
            mask = None if full else causal_offset_mask(q_len, ctx_len, self.device)
            meta.prefills.append(PrefillSpan(q_start, q_len, ctx_len, ctx, mask))
        embeds = merge_images(self.model.embed_tokens, ids, batch.images)
        positions = torch.from_numpy(batch.positions)
        hidden = self.model(ids, positions, self.kv_caches, meta, embeds)
        fill_prompt_logprobs(self.model, batch, hidden)
        if not len(batch.sample_rows):
            return hidden.new_empty(0)
        return self.model.compute_logits(hidden[torch.from_numpy(batch.sample_rows)])

    def _context_slots(self, table: np.ndarray, ctx_len: int) -> torch.Tensor:
        bt = torch.from_numpy(table).long()
        return (bt.unsqueeze(1) * self.block_size + self._offsets).flatten()[:ctx_len]

    def _decode_meta(self, meta: AttentionMetadata, batch: StepBatch) -> None:
        """Block ids per decode row (block 0 pads), and a mask only when lengths differ."""
        lens = batch.decode_ctx_lens
        meta.decode_len = longest = int(lens.max())
        width = -(-longest // self.block_size)
        # The compiled decode kernel takes int64 block ids (cpu_kernels/decode_attention.cpp).
        meta.decode_blocks = torch.from_numpy(batch.decode_tables[:, :width]).long()
        if int(lens.min()) < longest:
            ctx = torch.from_numpy(lens).unsqueeze(1)
            keep = torch.arange(longest, device=self.device) < ctx
            # Additive, in the cache dtype: SDPA would convert a bool mask in every layer.
            dtype = self.kv_caches[0][0].dtype
            bias = torch.zeros(keep.shape, dtype=dtype, device=self.device)
            meta.decode_mask = bias.masked_fill_(~keep, float("-inf"))[:, None, None, :]
        meta.decode_ctx_lens = torch.from_numpy(lens).int()

"""ModelRunner: turns scheduled chunks into packed tensors, runs the model, returns logits rows.

Two paths. Portable (CPU): per-sequence block lists and masks for the SDPA attention in
attention.py. Kernels (CUDA): flat numpy metadata uploaded through pinned memory without a host
sync, Triton paged attention, and pure-decode steps replayed from CUDA graphs. On CUDA a token id
may be a placeholder -(r + 1) for row r of the previous step's sampled ids, still on the GPU: the
stepper schedules step N+1 before step N's tokens reach the host (see overlap.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from trtllm_gateway.engine.builtin.attention import (
    AttentionMetadata,
    PrefillSpan,
    causal_offset_mask,
)
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.sampler import logprob_entry
from trtllm_gateway.engine.builtin.scheduler import ScheduledChunk, StepOutput
from trtllm_gateway.engine.builtin.vision.placeholders import image_embeds_for

if TYPE_CHECKING:
    from trtllm_gateway.engine.builtin.kernel_path import KernelPath


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        device: torch.device,
        max_model_len: int = 0,
        max_batch_size: int = 0,
        cuda_graphs: bool = False,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self._offsets = torch.arange(block_size, device=device)
        self.kernels: KernelPath | None = None
        if device.type == "cuda":
            from trtllm_gateway.engine.builtin.kernel_path import KernelPath

            self.kernels = KernelPath(
                model, kv_caches, block_size, device, max_model_len, max_batch_size, cuda_graphs
            )

    @property
    def overlap(self) -> bool:
        """True when run() may take placeholder ids and sampling stays on the device."""
        return self.kernels is not None

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        bt = torch.tensor(block_table, dtype=torch.long, device=self.device)
        return (bt.unsqueeze(1) * self.block_size + self._offsets).flatten()[start:end]

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk], prev: torch.Tensor | None = None) -> StepOutput:
        """prev: the previous step's sampled ids on the device (kernel path placeholders)."""
        if self.kernels is not None:
            return self.kernels.run(chunks, prev, self._prompt_logprobs)
        # Decodes (one new token) first so they batch into one attention call.
        ordered = sorted(chunks, key=lambda c: c.length != 1)
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        new_slots: list[torch.Tensor] = []
        meta = AttentionMetadata(slot_mapping=torch.empty(0), block_size=self.block_size)
        decode_slots: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        bs = self.block_size
        for c in ordered:
            seq, end = c.seq, c.start + c.length
            ids += seq.token_ids[c.start : end]
            positions.append(torch.arange(c.start, end, device=self.device))
            if c.length == 1:
                decode_slots.append(seq.block_table[c.start // bs] * bs + c.start % bs)
                decode_tables.append(seq.block_table[: -(-end // bs)])
                decode_lens.append(end)
                meta.num_decodes += 1
            else:
                ctx = self._slots(seq.block_table, 0, end)
                new_slots.append(ctx[c.start :])
                q_start = len(ids) - c.length
                full = c.start == 0
                meta.prefills.append(
                    PrefillSpan(
                        q_start=q_start,
                        q_len=c.length,
                        ctx_len=end,
                        ctx_slots=None if full else ctx,
                        mask=None if full else causal_offset_mask(c.length, end, self.device),
                    )
                )
        # Decodes come first in `ordered`, so their slots lead the mapping.
        decode_new = torch.tensor(decode_slots, dtype=torch.long, device=self.device)
        meta.slot_mapping = torch.cat([decode_new, *new_slots])
        if decode_tables:
            self._decode_meta(meta, decode_tables, decode_lens)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        embeds = image_embeds_for(self.model.embed_tokens, ordered, input_ids)
        hidden = self.model(input_ids, torch.cat(positions), self.kv_caches, meta, embeds)

        rows: list[int] = []
        sample_chunks: list[ScheduledChunk] = []
        offset = 0
        for c in ordered:
            if c.seq.sampling.prompt_logprobs is not None and not c.seq.prompt_logprobs_done:
                self._prompt_logprobs(c, hidden[offset : offset + c.length])
            if c.samples:
                rows.append(offset + c.length - 1)
                sample_chunks.append(c)
            offset += c.length
        logits = self.model.compute_logits(hidden[rows]) if rows else hidden.new_empty(0)
        return StepOutput(sample_chunks, logits)

    def _decode_meta(
        self, meta: AttentionMetadata, tables: list[list[int]], lens: list[int]
    ) -> None:
        """Block ids per decode row, padded with block 0, and a mask only when lengths differ."""
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        meta.decode_blocks = torch.tensor(padded, dtype=torch.long, device=self.device)
        meta.decode_len = max(lens)
        if min(lens) < meta.decode_len:
            ctx = torch.tensor(lens, device=self.device).unsqueeze(1)
            keep = torch.arange(meta.decode_len, device=self.device) < ctx
            # Additive, in the cache dtype: SDPA would convert a bool mask in every layer.
            dtype = self.kv_caches[0][0].dtype
            bias = torch.zeros(keep.shape, dtype=dtype, device=self.device)
            meta.decode_mask = bias.masked_fill_(~keep, float("-inf"))[:, None, None, :]
        meta.decode_ctx_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)

    def _prompt_logprobs(self, c: ScheduledChunk, hidden: torch.Tensor) -> None:
        """Logprob of each prompt token given the ones before it (row p predicts token p+1)."""
        seq = c.seq
        k = seq.sampling.prompt_logprobs or 0
        last = min(c.start + c.length, seq.prompt_len - 1)  # exclusive bound on predicting rows
        if last > c.start:
            lp = self.model.compute_logits(hidden[: last - c.start]).log_softmax(-1)
            for i in range(last - c.start):
                target = seq.token_ids[c.start + i + 1]
                seq.prompt_logprobs.append(logprob_entry(lp[i], target, k))
        if c.start + c.length >= seq.prompt_len:
            seq.prompt_logprobs_done = True

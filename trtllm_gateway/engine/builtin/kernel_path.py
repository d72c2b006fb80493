"""KernelPath: the CUDA half of ModelRunner: metadata without host syncs, kernels, decode graphs.

Metadata is built in numpy and uploaded through pinned memory with non-blocking copies, so the
host never waits for the GPU while it prepares a step. Decodes come first in the packed batch
(split-KV decode kernel), prefill chunks after them (packed prefill kernel). A step of decodes
only that fits a captured batch size replays a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from trtllm_gateway.engine.builtin.attention import AttentionMetadata, KernelPrefill
from trtllm_gateway.engine.builtin.cuda_graph import DecodeGraphs
from trtllm_gateway.engine.builtin.kernels.decode_attention import choose_splits, warm_up
from trtllm_gateway.engine.builtin.kernels.ops import KernelOps
from trtllm_gateway.engine.builtin.kernels.prefill_attention import prefill_tiles
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.scheduler import ScheduledChunk, StepOutput
from trtllm_gateway.engine.builtin.vision.placeholders import image_embeds_for, touches_images

PromptLogprobsFn = Callable[[ScheduledChunk, torch.Tensor], None]


class KernelPath:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        page: int,
        device: torch.device,
        max_model_len: int,
        max_batch_size: int,
        cuda_graphs: bool,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.page = page
        self.device = device
        self.num_kv_heads = model.cfg.num_kv_heads
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        model.ops = KernelOps(page)
        # Eager steps pick their split count per step: compile every variant now, not mid-serving.
        warm_up(*kv_caches[0], model.cfg.num_heads, model.embed_tokens.weight.dtype, page)
        # One token past max_model_len: the overlapped stepper may compute one wasted token.
        max_blocks = -(-(max_model_len + 1) // page)
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs:
            self.graphs = DecodeGraphs(
                model, kv_caches, min(max_batch_size, 512), max_blocks, max_model_len + 1, page
            )
            self.graphs.capture()

    def _up(self, data: Sequence[int] | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        host = torch.as_tensor(np.asarray(data)).to(dtype).pin_memory()
        return host.to(self.device, non_blocking=True)

    @staticmethod
    def _tables(tables: list[np.ndarray], rows: int) -> np.ndarray:
        width = max((len(t) for t in tables), default=1) or 1
        out = np.zeros((rows, width), dtype=np.int32)
        for i, t in enumerate(tables):
            out[i, : len(t)] = t
        return out

    @staticmethod
    def _resolve(ids: torch.Tensor, prev: torch.Tensor | None) -> None:
        """Replace placeholder ids -(r + 1) by row r of prev, in place, on the device."""
        assert prev is not None, "placeholder token ids need the previous step's samples"
        idx = (-ids - 1).clamp_(min=0)
        ids.copy_(torch.where(ids < 0, prev[idx], ids))

    @torch.inference_mode()
    def run(
        self,
        chunks: list[ScheduledChunk],
        prev: torch.Tensor | None,
        prompt_logprobs: PromptLogprobsFn,
    ) -> StepOutput:
        ordered = sorted(chunks, key=lambda c: c.length != 1)
        page = self.page
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        d_tables: list[np.ndarray] = []
        pf_tables: list[np.ndarray] = []
        pf_ctx: list[int] = []
        pf_start: list[int] = []
        pf_len: list[int] = []
        rows: list[int] = []
        sample_chunks: list[ScheduledChunk] = []
        wants_prompt_lps = False
        for c in ordered:
            seq, end = c.seq, c.start + c.length
            tbl = seq.block_table
            if c.length == 1:
                p = c.start
                ids.append(seq.token_ids[p])
                pos.append(p)
                slots.append(tbl[p // page] * page + p % page)
                d_tables.append(seq.block_table_array())
            else:
                pf_start.append(len(ids))
                pf_len.append(c.length)
                pf_ctx.append(end)
                pf_tables.append(seq.block_table_array())
                ids += seq.token_ids[c.start : end]
                r = np.arange(c.start, end)
                pos += r.tolist()
                slots += (np.asarray(tbl, dtype=np.int64)[r // page] * page + r % page).tolist()
            if c.samples:
                rows.append(len(ids) - 1)
                sample_chunks.append(c)
            if c.seq.sampling.prompt_logprobs is not None and not c.seq.prompt_logprobs_done:
                wants_prompt_lps = True
        nd = len(d_tables)
        has_images = touches_images(ordered)  # a 1-token prefill chunk may land on an image
        placeholders = min(ids) < 0
        g = self.graphs
        bucket = g.bucket(nd) if g is not None and nd == len(ordered) else None
        if g is not None and bucket is not None and not wants_prompt_lps and not has_images:
            logits = self._replay(
                g, bucket, ids, pos, slots, d_tables, prev if placeholders else None
            )
            if rows != list(range(nd)):
                logits = logits[self._up(rows, torch.long)]
            return StepOutput(sample_chunks, logits)

        input_ids = self._up(ids, torch.long)
        if placeholders:
            self._resolve(input_ids, prev)
        meta = AttentionMetadata(slot_mapping=self._up(slots, torch.long), num_decodes=nd)
        if nd:
            meta.decode_block_tables = self._up(self._tables(d_tables, nd), torch.int32)
            meta.decode_ctx_lens = self._up([p + 1 for p in pos[:nd]], torch.int32)
            longest = max(pos[:nd]) + 1
            meta.decode_splits = choose_splits(nd, self.num_kv_heads, longest, page, self.sms)
        if pf_len:
            n = len(pf_len)
            meta.prefill = KernelPrefill(
                block_tables=self._up(self._tables(pf_tables, n), torch.int32),
                ctx_lens=self._up(pf_ctx, torch.int32),
                q_starts=self._up(pf_start, torch.int32),
                q_lens=self._up(pf_len, torch.int32),
                tiles=self._up(prefill_tiles(list(range(n)), pf_len), torch.int32),
            )
        embeds = image_embeds_for(self.model.embed_tokens, ordered, input_ids)  # LLaVA prompts
        hidden = self.model(input_ids, self._up(pos, torch.long), self.kv_caches, meta, embeds)
        if wants_prompt_lps:
            offset = 0
            for c in ordered:
                if c.seq.sampling.prompt_logprobs is not None and not c.seq.prompt_logprobs_done:
                    prompt_logprobs(c, hidden[offset : offset + c.length])
                offset += c.length
        if not rows:
            return StepOutput(sample_chunks, hidden.new_empty(0))
        picked = hidden[self._up(rows, torch.long)]
        return StepOutput(sample_chunks, self.model.compute_logits(picked))

    def _replay(
        self,
        g: DecodeGraphs,
        bucket: int,
        ids: list[int],
        pos: list[int],
        slots: list[int],
        tables: list[np.ndarray],
        prev: torch.Tensor | None,
    ) -> torch.Tensor:
        n = len(ids)
        pad = bucket - n
        ids_h = np.asarray(ids + [0] * pad, dtype=np.int64)
        pos_h = np.asarray(pos + [0] * pad, dtype=np.int64)
        slots_h = np.asarray(slots + [-1] * pad, dtype=np.int64)
        ctx_h = np.zeros(bucket, dtype=np.int32)
        ctx_h[:n] = pos_h[:n] + 1
        bt = self._tables(tables, bucket)
        g.input_ids[:bucket].copy_(self._up(ids_h, torch.long), non_blocking=True)
        if prev is not None:
            self._resolve(g.input_ids[:bucket], prev)
        g.positions[:bucket].copy_(self._up(pos_h, torch.long), non_blocking=True)
        g.slots[:bucket].copy_(self._up(slots_h, torch.long), non_blocking=True)
        g.ctx_lens[:bucket].copy_(self._up(ctx_h, torch.int32), non_blocking=True)
        g.block_tables[:bucket, : bt.shape[1]].copy_(self._up(bt, torch.int32), non_blocking=True)
        return g.replay(bucket)[:n]

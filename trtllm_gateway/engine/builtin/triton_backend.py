"""TritonBackend: a StepBatch's forward on CUDA: pinned uploads, Triton kernels, decode graphs.

The batch's numpy arrays are uploaded through pinned memory with non-blocking copies, so the
host never waits for the GPU while it prepares a step. Decodes lead the packed batch (split-KV
decode kernel), prefill chunks follow (packed prefill kernel). A step of decodes only that fits
a captured batch size replays a CUDA graph of the whole step (cuda_graph.py); another step of
17 to 2,048 tokens (8,192 for a small model) replays one graph of the whole step, attentions
included (step_graph.py), or, past its 32 prompt chunks, the graphs between its attentions,
which then run eagerly (piecewise_graph.py); the rest (images, prompt logprobs, tiny or huge
steps) runs eagerly. The GPU runs a step while the host resolves the one before: the default
overlap depth is 1 (pipeline.py). A decode graph samples too: a step whose rows all draw straight
from the logits (sampler.Draws) gets its ids from the graph, with no kernel launched from Python.
"""

from __future__ import annotations

import numpy as np
import torch

from trtllm_gateway.engine.builtin.attention import AttentionMetadata, KernelPrefill
from trtllm_gateway.engine.builtin.backend import (
    KvCaches,
    fill_prompt_logprobs,
    resolve_placeholders,
)
from trtllm_gateway.engine.builtin.cuda_graph import DecodeGraphs
from trtllm_gateway.engine.builtin.kernels import sampling
from trtllm_gateway.engine.builtin.kernels.decode_attention import (
    choose_splits,
    takes_all_heads,
    warm_up,
)
from trtllm_gateway.engine.builtin.kernels.ops import KernelOps
from trtllm_gateway.engine.builtin.kernels.prefill_attention import BLOCK_M, prefill_tiles
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.piecewise_graph import MIN_TOKENS, PiecewiseGraphs
from trtllm_gateway.engine.builtin.pinned_ring import PinnedRing
from trtllm_gateway.engine.builtin.sampler import Draws
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.step_graph import StepGraphs
from trtllm_gateway.engine.builtin.vision.placeholders import merge_images


class TritonBackend:
    depth = 1

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: KvCaches,
        page: int,
        device: torch.device,
        max_model_len: int,
        max_batch_size: int,
        cuda_graphs: bool,
        max_num_tokens: int = 0,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.page = page
        self.device = device
        self.num_kv_heads = model.cfg.num_kv_heads
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        self._staging = PinnedRing(device)
        model.ops = KernelOps(page)
        dtype = model.embed_tokens.weight.dtype
        # decode_attention_heads' kernel (one program a sequence) splits by its own rule
        self.all_heads = takes_all_heads(model.cfg.num_heads, dtype, *kv_caches[0], page)
        # Eager steps pick their split count per step: compile every variant now, not mid-serving.
        warm_up(*kv_caches[0], model.cfg.num_heads, dtype, page)
        # float32 logits from eager steps, the model's dtype from the decode graphs
        head = model.lm_head.weight
        sampling.compile_for(head.shape[0], device, (torch.float32, head.dtype))
        # One token past max_model_len: at depth 1 a stopped sequence computes one wasted token.
        max_blocks = -(-(max_model_len + 1) // page)
        self.graphs: DecodeGraphs | None = None
        self.takes_draws = cuda_graphs
        if cuda_graphs:
            self.graphs = DecodeGraphs(
                model, kv_caches, min(max_batch_size, 512), max_blocks, max_model_len + 1, page
            )
            self.graphs.capture()
        self.pieces: PiecewiseGraphs | None = None
        self.whole: StepGraphs | None = None
        if cuda_graphs and max_num_tokens >= MIN_TOKENS:
            # The previous step sampled at most a row a sequence: max_batch_size ids.
            self.pieces = PiecewiseGraphs(model, kv_caches, max_num_tokens, max_batch_size)
            self.pieces.capture()
            hk, longest = self.num_kv_heads, max_blocks * page

            def splits_for(rows: int) -> int:
                return choose_splits(rows, hk, longest, page, self.sms, self.all_heads)

            self.whole = StepGraphs(self.pieces, max_batch_size, max_blocks, splits_for, BLOCK_M)
            self.whole.capture()

    def _up(self, data: np.ndarray | list[int], dtype: torch.dtype) -> torch.Tensor:
        return self._staging.upload(data, dtype)

    @torch.inference_mode()
    def forward(
        self, batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        nd = batch.num_decodes
        rows = batch.sample_rows
        g = self.graphs
        pure_decode = nd == batch.num_chunks
        bucket = g.bucket(nd) if g is not None and pure_decode else None
        # A 1-token prefill chunk may land on an image, so a "decode" batch may carry images;
        # and a graph holds the previous step's ids only up to its largest bucket (a step
        # before may have sampled more rows, past the 512 rows graphs are captured for).
        fits = prev is None or g is None or len(prev) <= g.max_batch_size
        if (
            g is not None
            and bucket is not None
            and fits
            and not batch.prompt_logprobs
            and not batch.images
        ):
            # The graph samples every row it runs: its ids are the step's when each row samples.
            if draws is not None and len(rows) == nd:
                g.set_draws(draws.packed, nd, self._staging)
                logits = self._replay(g, bucket, batch, prev)
                draws.ids = g.sampled(bucket, nd)
                return logits
            logits = self._replay(g, bucket, batch, prev)
            if len(rows) != nd:
                logits = logits[self._up(rows, torch.long)]
            return logits

        tokens = len(batch.token_ids)
        pw = self.pieces
        b = pw.bucket(tokens) if pw is not None else None
        if (
            pw is not None
            and b is not None
            and (prev is None or len(prev) <= len(pw.prev))
            and not batch.images
        ):
            host = pw.host_inputs(b, batch.token_ids, batch.positions, batch.slots)
            pw.load(self._up(host, torch.long), b, prev if batch.placeholders else None)
            whole = self.whole
            if whole is not None and whole.takes(batch, b, self._splits(batch)):
                whole.load(self._up(whole.host_meta(b, batch), torch.int32), b, batch)
                hidden = whole.replay(b, tokens)
            else:
                hidden = pw.run(b, tokens, self._meta(batch, pw.slots[:tokens]))
        else:
            input_ids = self._up(batch.token_ids, torch.long)
            if batch.placeholders:
                input_ids = resolve_placeholders(input_ids, prev)
            meta = self._meta(batch, self._up(batch.slots, torch.long))
            embeds = merge_images(self.model.embed_tokens, input_ids, batch.images)  # LLaVA
            positions = self._up(batch.positions, torch.long)
            hidden = self.model(input_ids, positions, self.kv_caches, meta, embeds)
        fill_prompt_logprobs(self.model, batch, hidden)
        if not len(rows):
            return hidden.new_empty(0)
        return self.model.compute_logits(hidden[self._up(rows, torch.long)])

    def _meta(self, batch: StepBatch, slots: torch.Tensor) -> AttentionMetadata:
        """The step's attention metadata on the device (decode tables, prefill tiles)."""
        nd = batch.num_decodes
        meta = AttentionMetadata(slot_mapping=slots, num_decodes=nd)
        if nd:
            meta.decode_block_tables = self._up(batch.decode_tables, torch.int32)
            meta.decode_ctx_lens = self._up(batch.decode_ctx_lens, torch.int32)
            meta.decode_splits = self._splits(batch)
        q_lens = batch.prefill_q_lens
        if len(q_lens):
            n = len(q_lens)
            meta.prefill = KernelPrefill(
                block_tables=self._up(batch.prefill_tables, torch.int32),
                ctx_lens=self._up(batch.prefill_ctx_lens, torch.int32),
                q_starts=self._up(batch.prefill_q_starts, torch.int32),
                q_lens=self._up(q_lens, torch.int32),
                tiles=self._up(prefill_tiles(list(range(n)), q_lens.tolist()), torch.int32),
            )
        return meta

    def _splits(self, batch: StepBatch) -> int:
        """The split-KV count this step's decodes would run at eagerly."""
        nd = batch.num_decodes
        if not nd:
            return 1
        longest = int(batch.positions[:nd].max()) + 1
        return choose_splits(nd, self.num_kv_heads, longest, self.page, self.sms, self.all_heads)

    def _replay(
        self, g: DecodeGraphs, bucket: int, batch: StepBatch, prev: torch.Tensor | None
    ) -> torch.Tensor:
        n = batch.num_decodes
        host = g.host_inputs(
            bucket, batch.token_ids, batch.positions, batch.slots, batch.decode_tables
        )
        g.load(self._up(host, torch.int32), bucket)
        if batch.placeholders:
            assert prev is not None, "placeholder token ids need the previous step's samples"
            g.prev[: len(prev)].copy_(prev)
        return g.replay(bucket)[:n]

"""PiecewiseGraphs: CUDA graphs of a step's work between its attentions, for the steps that
DecodeGraphs does not take (a prefill chunk beside the decodes, or decodes past its largest batch).

Such a step ran eagerly: about ten launches a layer (QKV, RoPE + store, the attention's two
kernels, o_proj, add + norm, gate_up, SiLU-mul, down, add + norm), each a Python call, so a
small model's mixed step cost the host several milliseconds while the GPU's work took less
(issue 39: at 135M with 256 running, one prompt's prefill rides along most steps). Here the step
is cut at every attention, as vLLM's piecewise graphs cut it: piece 0 embeds and runs layer 0 up
to its attention, piece k (0 < k < L) is layer k-1 after its attention and layer k up to its,
piece L the last layer's tail and the final norm. The attention runs eagerly between the pieces,
its metadata (decode tables, prefill tiles) being the step's own; the pieces are captured at
bucketed token counts, reading static buffers of ids, positions and slots that the step fills
(padding rows: id 0, position 0, slot -1, which writes no KV) and writing the queries and hidden
states to static buffers the attention and the LM head read. The previous step's sampled ids
are swapped in for placeholders inside piece 0, as in the decode graphs.

StepGraphs (step_graph.py) captures these pieces again with the attentions between them, at
launch shapes fixed per bucket, so a mixed step replays as one graph; the pieces run on their own
for a step of more prompt chunks than it takes.

The pieces are those of LlamaModel's fused path (Attention.project_and_store,
LlamaModel.fused_layer_tail), so eager and piecewise steps run the same kernels; only the GEMMs
see the bucket's padded row count.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from trtllm_gateway.engine.builtin.attention import AttentionMetadata
from trtllm_gateway.engine.builtin.capture_gc import no_collection
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.model_config import ModelConfig

logger = logging.getLogger(__name__)

# Up to skinny_gemm.MAX_ROWS (16) tokens the fused path runs its skinny GEMMs; that module
# imports Triton, this one must not (tests/gpu/test_piecewise_graph.py checks the two agree).
MIN_TOKENS = 17
BASE_TOKENS = 2048  # every model's steps up to this many tokens run from the pieces
MAX_TOKENS = 8192  # a small model's, up to this many (largest_bucket)
# A step whose GEMMs are this much work hides the host's launches of an eager step: at half an
# H200's bf16 peak 8 TFLOP is ~16 ms, and an eager 30-layer step's ~300 launches took ~15.6 ms
# of the host's time (StepClock, 135M served at 256 running, 2026-11-28). An 8B step passes it
# at ~600 tokens, 135M's never below 8,192: there an 8,192-token step ran eagerly, 5% of the
# steps and a third of the time.
HIDES_LAUNCHES_FLOP = 8e12


def hiding_tokens(cfg: ModelConfig) -> int:
    """The fewest tokens whose step GEMMs hide an eager step's launches (HIDES_LAUNCHES_FLOP)."""
    h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    q = cfg.num_heads * cfg.head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size
    return int(HIDES_LAUNCHES_FLOP / (2 * cfg.num_layers * layer))


def largest_bucket(max_tokens: int, cfg: ModelConfig) -> int:
    """The most tokens a step runs from the pieces: BASE_TOKENS, or for a model too small for
    its GPU work to hide an eager step's launches up to MAX_TOKENS; at most max_tokens."""
    return min(max_tokens, max(BASE_TOKENS, min(hiding_tokens(cfg), MAX_TOKENS)))


def piece_sizes(top: int) -> list[int]:
    """Token-count buckets: 32, 64, 128, then every 128 to BASE_TOKENS and every 512 after it,
    up to the first that holds top."""
    sizes: list[int] = []
    steps = (*range(128, BASE_TOKENS + 1, 128), *range(BASE_TOKENS + 512, MAX_TOKENS + 1, 512))
    for b in (32, 64, *steps):
        sizes.append(b)
        if b >= top:
            break
    return sizes


class PiecewiseGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_tokens: int,
        max_prev: int,
    ) -> None:
        cfg = model.cfg
        weight = model.embed_tokens.weight
        dev, dtype = weight.device, weight.dtype
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = piece_sizes(largest_bucket(max_tokens, cfg))
        n = self.max_tokens = self.sizes[-1]
        self.inputs = torch.zeros((3, n), dtype=torch.long, device=dev)  # ids, positions, slots
        self.inputs[2] = -1
        self.prev = torch.zeros(max_prev, dtype=torch.long, device=dev)  # placeholders' ids
        self.residual = torch.zeros((n, cfg.hidden_size), dtype=dtype, device=dev)
        self.q = torch.zeros((n, cfg.num_heads, cfg.head_dim), dtype=dtype, device=dev)
        self.o = torch.zeros_like(self.q)
        self.hidden = torch.zeros((n, cfg.hidden_size), dtype=dtype, device=dev)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.replays = 0  # steps run from the pieces (tests, benchmarks)

    def bucket(self, tokens: int) -> int | None:
        if tokens < MIN_TOKENS:
            return None
        for b in self.sizes:
            if b >= tokens:
                return b
        return None

    def host_inputs(
        self, b: int, token_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray
    ) -> np.ndarray:
        """[3, b] int64: the step's ids, positions and slots, then padding (0, 0, -1)."""
        t = len(token_ids)
        host = np.zeros((3, b), dtype=np.int64)
        host[0, :t] = token_ids
        host[1, :t] = positions
        host[2, t:] = -1
        host[2, :t] = slots
        return host

    def load(self, inputs: torch.Tensor, b: int, prev: torch.Tensor | None) -> None:
        """host_inputs(b, ...) as uploaded, and the previous step's ids (placeholders)."""
        self.inputs[:, :b].copy_(inputs.view(3, b))
        if prev is not None:
            self.prev[: len(prev)].copy_(prev)

    @property
    def slots(self) -> torch.Tensor:
        return self.inputs[2]

    def run(self, b: int, tokens: int, meta: AttentionMetadata) -> torch.Tensor:
        """The step's hidden states [tokens, hidden] (a view of a static buffer: read it before
        the next step). meta: the step's attention metadata, its slot mapping `slots`."""
        ops = self.model.ops
        assert ops is not None
        pieces = self.graphs[b]
        q, o = self.q[:tokens], self.o[:tokens]
        for layer, kv, piece in zip(
            self.model.decoder_layers, self.kv_caches, pieces, strict=False
        ):
            piece.replay()
            at = layer.self_attn
            ops.attention(q, kv, meta, at.scale, at.kv_scales, out=o)
        pieces[-1].replay()
        self.replays += 1
        return self.hidden[:tokens]

    def piece(self, b: int, k: int) -> None:
        """Piece k of bucket b's step, as captured (the whole-step graphs run them too)."""
        m = self.model
        ops = m.ops
        assert ops is not None
        layers = m.decoder_layers
        residual = self.residual[:b]
        if k == 0:
            raw = self.inputs[0, :b]
            last = len(self.prev) - 1
            ids = torch.where(raw < 0, self.prev[(-raw - 1).clamp(0, last)], raw)
            residual.copy_(m.embed_tokens(ids))
            first = layers[0]
            w, eps = first.input_layernorm.weight, m.cfg.rms_norm_eps
            x = ops.norm_for(residual, w, eps, first.self_attn.qkv_proj)
        else:
            x = m.fused_layer_tail(k - 1, self.o[:b], residual)
        if k == len(layers):
            assert isinstance(x, torch.Tensor)  # the final norm's: the model dtype
            self.hidden[:b].copy_(x)
            return
        positions, slots = self.inputs[1, :b], self.inputs[2, :b]
        at = layers[k].self_attn
        self.q[:b].copy_(at.project_and_store(x, positions, m.rope, self.kv_caches[k], slots, ops))

    @torch.inference_mode()
    def capture(self) -> None:
        """Every bucket's pieces, largest first, into one memory pool. The inputs are padding
        then (slot -1): capturing writes no KV."""
        t0 = time.perf_counter()
        pool = None
        pieces = len(self.model.decoder_layers) + 1
        with no_collection():  # capture_gc.py: no collection mid-capture
            for b in reversed(self.sizes):
                graphs = []
                for k in range(pieces):
                    self.piece(b, k)  # warm-up: compiles the Triton kernels, sets cuBLAS up
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool):
                        self.piece(b, k)
                    if pool is None:
                        pool = g.pool()
                    graphs.append(g)
                self.graphs[b] = graphs
        torch.cuda.synchronize()
        logger.info(
            "captured %d piecewise graphs (%d token buckets up to %d) in %.1fs",
            pieces * len(self.sizes),
            len(self.sizes),
            self.max_tokens,
            time.perf_counter() - t0,
        )

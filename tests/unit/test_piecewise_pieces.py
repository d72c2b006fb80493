"""PiecewiseGraphs' plumbing on the CPU (engine/builtin/piecewise_graph.py): a mixed step (decodes
whose ids are placeholders for the previous step's samples, and a prefill chunk) run piece by
piece through the static buffers, with the attention between the pieces, gives the hidden states
and the KV cache of LlamaModel's fused path run in one go; the bucket's padding rows write no KV.

The graphs themselves need CUDA (tests/gpu/test_piecewise_graph.py): here each piece is called
instead of replayed, and the fused operations are TorchOps, plain-torch versions of KernelOps'
kernels (the references tests/gpu/test_kernels.py holds them to). Both paths use the same ops, so
what is compared is only the cutting into pieces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_gateway.engine.builtin.attention import AttentionMetadata, KernelPrefill
from trtllm_gateway.engine.builtin.model import LlamaModel
from trtllm_gateway.engine.builtin.model_config import ModelConfig
from trtllm_gateway.engine.builtin.piecewise_graph import (
    PiecewiseGraphs,
    largest_bucket,
    piece_sizes,
)

PAGE = 4
CFG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 3,
    "vocab_size": 300,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
}


def test_buckets() -> None:
    assert piece_sizes(2048) == [32, 64, *range(128, 2049, 128)]
    assert piece_sizes(100) == [32, 64, 128]
    assert piece_sizes(64) == [32, 64] and piece_sizes(20) == [32]
    assert piece_sizes(8192) == [32, 64, *range(128, 2049, 128), *range(2560, 8193, 512)]
    assert piece_sizes(3000)[-2:] == [2560, 3072]


def _shape(hidden: int, inter: int, layers: int, heads: int, kv_heads: int) -> ModelConfig:
    return ModelConfig(
        "llama", 1000, hidden, inter, layers, heads, kv_heads, hidden // heads, 1e-5, 1e4
    )


def test_a_small_model_runs_larger_steps_from_the_pieces() -> None:
    """An 8B step's GEMMs hide its eager launches past ~600 tokens: pieces up to 2,048 (the
    base). 135M's never do within 8,192: pieces up to the step budget. A 1B between."""
    llama_8b = _shape(4096, 14336, 32, 32, 8)
    smollm2_135m = _shape(576, 1536, 30, 9, 3)
    llama_1b = _shape(2048, 8192, 16, 32, 8)
    assert largest_bucket(8192, llama_8b) == 2048
    assert largest_bucket(8192, smollm2_135m) == 8192
    assert largest_bucket(2048, smollm2_135m) == 2048  # never past the step budget
    assert largest_bucket(1024, llama_8b) == 1024
    assert 2048 < largest_bucket(8192, llama_1b) < 8192


class TorchOps:
    """KernelOps' operations in plain torch (float32, CPU)."""

    def __init__(self, page: int) -> None:
        self.page = page

    def use_skinny(self, x: torch.Tensor) -> bool:
        return False

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if residual is not None:
            residual += x
            x = residual
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, -1)
        return F.silu(gate) * up

    # The fused path's calls (float32: no FP8 layer, nothing quantized).
    def norm_for(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        then: nn.Module | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.rms_norm(x, weight, eps, residual)

    def add_norm_for(
        self,
        x: torch.Tensor,
        layer: nn.Module,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        then: nn.Module | None,
    ) -> torch.Tensor:
        return self.rms_norm(layer(x), weight, eps, residual)

    def silu_mul_for(self, gate_up: torch.Tensor, then: nn.Module) -> torch.Tensor:
        return self.silu_mul(gate_up)

    def project(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        out: torch.Tensor = layer(x)
        return out

    def rope_and_store(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        shape: tuple[int, int, int],
        kv_scales: tuple[float, float] = (1.0, 1.0),
    ) -> torch.Tensor:
        nq, nkv, hd = shape
        t, half = qkv.shape[0], hd // 2
        c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

        def rot(x: torch.Tensor) -> torch.Tensor:
            return x * c + torch.cat([-x[..., half:], x[..., :half]], -1) * s

        q = rot(qkv[:, : nq * hd].reshape(t, nq, hd))
        k = rot(qkv[:, nq * hd : (nq + nkv) * hd].reshape(t, nkv, hd))
        v = qkv[:, (nq + nkv) * hd :].reshape(t, nkv, hd)
        keep = slots >= 0  # a padded row writes nothing
        kv[0][slots[keep]] = k[keep]
        kv[1][slots[keep]] = v[keep]
        return q.contiguous()

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
            out[r : r + 1] = self._one(q[r : r + 1], kv, tables[r], int(lens[r]), scale)
        pf = meta.prefill
        if pf is not None:
            for p in range(len(pf.q_lens)):
                s0, n, ctx = int(pf.q_starts[p]), int(pf.q_lens[p]), int(pf.ctx_lens[p])
                out[s0 : s0 + n] = self._one(q[s0 : s0 + n], kv, pf.block_tables[p], ctx, scale)
        return out

    def _one(
        self,
        q: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        table: torch.Tensor,
        ctx: int,
        scale: float,
        first: int | None = None,
    ) -> torch.Tensor:
        """q's rows at positions first.. (default: the context's last rows) over ctx tokens."""
        slots = (table.long()[:, None] * self.page + torch.arange(self.page)).flatten()[:ctx]
        group = q.shape[1] // kv[0].shape[1]
        k = kv[0][slots].repeat_interleave(group, 1)
        v = kv[1][slots].repeat_interleave(group, 1)
        s = torch.einsum("nhd,thd->nht", q, k) * scale
        first = ctx - q.shape[0] if first is None else first
        pos = torch.arange(first, first + q.shape[0])
        s = s.masked_fill((torch.arange(ctx)[None, :] > pos[:, None])[:, None, :], float("-inf"))
        return torch.einsum("nht,thd->nhd", s.softmax(-1), v)


class _Called:
    """A piece called where a CUDA graph would be replayed."""

    def __init__(self, pw: PiecewiseGraphs, b: int, k: int) -> None:
        self.pw, self.b, self.k = pw, b, k

    def replay(self) -> None:
        self.pw.piece(self.b, self.k)


def _caches(cfg: ModelConfig, slots: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    shape = (slots, cfg.num_kv_heads, cfg.head_dim)
    return [
        (torch.randn(shape, generator=g), torch.randn(shape, generator=g))
        for _ in range(cfg.num_layers)
    ]


@torch.inference_mode()
def test_a_mixed_step_piece_by_piece_equals_the_fused_path() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict(CFG)
    model = LlamaModel(cfg, 256).eval()
    model.ops = TorchOps(PAGE)  # type: ignore[assignment]
    # Three decodes (contexts 9, 14 and 5 tokens, the new one included) and a 20-token prefill
    # chunk after 6 cached tokens: 23 rows, bucket 32.
    tables = torch.tensor([[3, 7, 11, 0], [1, 2, 9, 15], [4, 13, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([9, 14, 5], dtype=torch.int32)
    p_table = torch.tensor([[5, 6, 8, 10, 12, 14, 16]], dtype=torch.int32)
    d_pos = (lens - 1).long()
    d_slots = tables.long()[torch.arange(3), d_pos // PAGE] * PAGE + d_pos % PAGE
    p_pos = torch.arange(6, 26)
    p_slots = p_table.long()[0, p_pos // PAGE] * PAGE + p_pos % PAGE
    prev = torch.tensor([17, 250, 42, 99])  # the previous step's samples
    decode_ids = torch.tensor([-2, -4, -1])  # placeholders: rows 1, 3 and 0 of prev
    prompt = torch.randint(0, cfg.vocab_size, (20,))
    raw_ids = torch.cat([decode_ids, prompt])
    positions = torch.cat([d_pos, p_pos])
    slots = torch.cat([d_slots, p_slots])
    tokens = len(raw_ids)
    prefill = KernelPrefill(
        block_tables=p_table,
        ctx_lens=torch.tensor([26], dtype=torch.int32),
        q_starts=torch.tensor([3], dtype=torch.int32),
        q_lens=torch.tensor([20], dtype=torch.int32),
        tiles=torch.zeros(0, dtype=torch.int32),  # the Triton kernel's; TorchOps needs none
    )

    def meta(slot_mapping: torch.Tensor) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=slot_mapping,
            num_decodes=3,
            decode_block_tables=tables,
            decode_ctx_lens=lens,
            prefill=prefill,
        )

    eager_kv, piece_kv = _caches(cfg, 17 * PAGE), _caches(cfg, 17 * PAGE)
    ids = torch.where(raw_ids < 0, prev[(-raw_ids - 1).clamp(min=0)], raw_ids)
    want = model(ids, positions, eager_kv, meta(slots))

    pw = PiecewiseGraphs(model, piece_kv, max_tokens=128, max_prev=8)
    b = pw.bucket(tokens)
    assert b == 32 and pw.bucket(16) is None and pw.bucket(129) is None
    pw.graphs[b] = [_Called(pw, b, k) for k in range(cfg.num_layers + 1)]
    host = pw.host_inputs(b, raw_ids.numpy(), positions.numpy(), slots.numpy())
    pw.inputs[2].fill_(5)  # a bigger step's slots left behind: the padding must overwrite them
    pw.load(torch.from_numpy(host), b, prev)
    got = pw.run(b, tokens, meta(pw.slots[:tokens]))

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert pw.replays == 1
    for (ke, ve), (kp, vp) in zip(eager_kv, piece_kv, strict=True):
        torch.testing.assert_close(kp, ke, rtol=1e-5, atol=1e-5)  # padding rows wrote nothing
        torch.testing.assert_close(vp, ve, rtol=1e-5, atol=1e-5)
    assert (pw.slots[tokens:b] == -1).all()

"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM2) over a paged KV cache.

GQA, RMSNorm, SwiGLU, optional QKV bias, tied embeddings. Q/K/V and gate/up projections are fused
at load time. Tokens of all sequences in a step are packed into one [T, hidden] batch.
On CUDA the runner sets `ops` (kernels.ops.KernelOps): the forward pass then runs fused Triton
kernels (add+RMSNorm, RoPE+KV store, paged attention, SiLU-mul) around the cuBLAS projections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_gateway.engine.builtin.attention import AttentionMetadata, paged_attention
from trtllm_gateway.engine.builtin.model_config import ModelConfig
from trtllm_gateway.engine.builtin.rope import RotaryEmbedding, rotate

if TYPE_CHECKING:
    from trtllm_gateway.engine.builtin.kernels.fp8_quant import QuantRows
    from trtllm_gateway.engine.builtin.kernels.ops import KernelOps

AttentionFn = Callable[..., torch.Tensor]


class DecodeStep(Protocol):
    """The CPU path's whole-stack decode (cpu_decode.CpuDecode), set by the loader."""

    def applies(
        self,
        input_ids: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> bool: ...

    def forward(
        self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor: ...


def linear_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every nn.Linear: what weight formats swap in place."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # The CPU kernel (cpu_kernels/rms_norm.cpp) for float32 rows, set by the loader.
        self.kernel: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dtype == torch.float32 and x.dim() == 2:
            return self.kernel(x.contiguous(), self.weight, self.eps)
        # Normalize in float32, round, then scale: HF's order, so bf16 rounds as it does there.
        xf = x.float()
        if xf.is_cpu:  # one fused kernel, bit-identical to the chain below on CPU
            xf = F.rms_norm(xf, self.weight.shape, eps=self.eps)
        else:  # the eager path on CUDA is the kernels' reference: keep HF's exact ops
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.nq, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.nq * self.hd, self.nkv * self.hd
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.scale = self.hd**-0.5
        # An e4m3 KV cache's (k_scale, v_scale): 1.0 unless the checkpoint has them (fp8.py).
        self.kv_scales = (1.0, 1.0)
        # The CPU kernel (cpu_kernels/fused_ops.cpp) that rotates Q/K and stores K/V in one pass,
        # set by the loader with the decode kernel; attn_fn then finds the cache written.
        self.rope_store: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        attn_fn: AttentionFn,
    ) -> torch.Tensor:
        """rope: this step's (cos, signed sin) from RotaryEmbedding.tables."""
        t, qk = x.shape[0], self.q_size + self.kv_size
        qkv = self.qkv_proj(x)
        v = qkv[:, qk:].view(t, self.nkv, self.hd)
        if self.rope_store is not None and qkv.dtype == torch.float32:
            q, k = self.rope_store(qkv, *rope, kv[0], kv[1], meta.slot_mapping, self.nq, self.nkv)
            o = attn_fn(q, k, v, kv[0], kv[1], meta, self.scale, kv_written=True)
            return self.o_proj(o.reshape(t, self.q_size))
        # Q and K heads are adjacent in the fused projection: rotate them in one go.
        qk_rot = rotate(qkv[:, :qk].view(t, self.nq + self.nkv, self.hd), *rope)
        q, k = qk_rot[:, : self.nq], qk_rot[:, self.nq :]
        o = attn_fn(q, k, v, kv[0], kv[1], meta, self.scale)
        return self.o_proj(o.reshape(t, self.q_size))

    def project_and_store(
        self,
        x: torch.Tensor | QuantRows,
        positions: torch.Tensor,
        rope: RotaryEmbedding,
        kv: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        ops: KernelOps,
    ) -> torch.Tensor:
        """The fused path up to attention: QKV, then RoPE with K/V stored. The queries.
        x: the input norm's output, quantized per row for an Fp8Linear (KernelOps.norm_for)."""
        qkv = ops.project(x, self.qkv_proj)
        shape = (self.nq, self.nkv, self.hd)
        return ops.rope_and_store(
            qkv, positions, rope.cos, rope.sin, kv, slots, shape, self.kv_scales
        )


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * self.inter, bias=False)
        self.down_proj = nn.Linear(self.inter, cfg.hidden_size, bias=False)
        # The CPU kernel (cpu_kernels/fused_ops.cpp) for float32 rows, set by the loader.
        self.silu_mul: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.silu_mul is not None and gate_up.dtype == torch.float32 and gate_up.dim() == 2:
            return self.down_proj(self.silu_mul(gate_up))
        gate, up = gate_up.split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.decoder_layers: list[DecoderLayer] = [
            m for m in self.layers if isinstance(m, DecoderLayer)
        ]
        self.rope = RotaryEmbedding(cfg, max_positions)
        self.attn_fn: AttentionFn = paged_attention
        self.ops: KernelOps | None = None
        # CPU, packed float32 weights: pure decode steps in one C++ call (cpu_decode.py), the
        # same kernels in the same order as the loop below.
        self.cpu_decode: DecodeStep | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] after the final norm."""
        if self.ops is not None:
            return self._forward_fused(input_ids, positions, kv_caches, meta, inputs_embeds)
        # A fresh residual stream (never the caller's embeds), so the adds can be in place.
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds.clone()
        rope = self.rope.tables(positions)
        fused = self.cpu_decode
        if (
            fused is not None
            and inputs_embeds is None
            and fused.applies(input_ids, kv_caches, meta)
        ):
            return fused.forward(h, rope, meta)
        for layer, kv in zip(self.decoder_layers, kv_caches, strict=True):
            h += layer.self_attn(layer.input_layernorm(h), rope, kv, meta, self.attn_fn)
            h += layer.mlp(layer.post_attention_layernorm(h))
        out: torch.Tensor = self.norm(h)
        return out

    def _forward_fused(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor:
        ops = self.ops
        assert ops is not None
        eps = self.cfg.rms_norm_eps
        # The residual stream is updated in place by the add+norm kernel.
        residual = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds.clone()
        layers = self.decoder_layers
        first = layers[0]
        x = ops.norm_for(residual, first.input_layernorm.weight, eps, first.self_attn.qkv_proj)
        for i, (layer, kv) in enumerate(zip(layers, kv_caches, strict=True)):
            at = layer.self_attn
            q = at.project_and_store(x, positions, self.rope, kv, meta.slot_mapping, ops)
            o = ops.attention(q, kv, meta, at.scale, at.kv_scales)
            x = self.fused_layer_tail(i, o, residual)
        assert isinstance(x, torch.Tensor)  # the final norm's: the LM head's, model dtype
        return x

    def fused_layer_tail(
        self, i: int, o: torch.Tensor, residual: torch.Tensor
    ) -> torch.Tensor | QuantRows:
        """Layer i of the fused path after its attention output o [T, Hq, D]: o_proj added into
        the residual stream, its norm, the MLP, down_proj added, and the next layer's input norm
        (after the last layer the final norm, in the model dtype). The residual stream is updated
        in place; returns the next layer's input, quantized per row where it feeds an Fp8Linear
        (KernelOps.norm_for)."""
        ops = self.ops
        assert ops is not None
        eps = self.cfg.rms_norm_eps
        layers = self.decoder_layers
        layer = layers[i]
        at, mlp = layer.self_attn, layer.mlp
        post = layer.post_attention_layernorm.weight
        o2 = o.view(o.shape[0], at.q_size)
        x = ops.add_norm_for(o2, at.o_proj, residual, post, eps, mlp.gate_up_proj)
        act = ops.silu_mul_for(ops.project(x, mlp.gate_up_proj), mlp.down_proj)
        if i + 1 < len(layers):
            nxt = layers[i + 1]
            w, then = nxt.input_layernorm.weight, nxt.self_attn.qkv_proj
            return ops.add_norm_for(act, mlp.down_proj, residual, w, eps, then)
        return ops.add_norm_for(act, mlp.down_proj, residual, self.norm.weight, eps, None)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def logits_into(self, hidden: torch.Tensor, out: torch.Tensor) -> None:
        """The lm_head's logits written by its GEMM into out, in the model's dtype: no float
        copy (the decode graph's; the sampler widens them only for a row that needs it)."""
        torch.mm(hidden, self.lm_head.weight.t(), out=out)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors, fusing q/k/v and gate/up into the packed projections."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for raw_name, tensor in weights:
            name = canonical_name(raw_name)
            if "rotary_emb" in name or (self.cfg.tie_word_embeddings and name == "lm_head.weight"):
                continue
            target, offset = packed_target(name, self.cfg)
            if target not in params:
                continue
            param = params[target]
            param[offset : offset + tensor.shape[0]].copy_(tensor.to(param.dtype))
            loaded.add(name)
        missing = expected_names(self.cfg) - loaded
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def canonical_name(name: str) -> str:
    """HF Llama naming, also for a language model nested inside a LLaVA checkpoint."""
    name = name.replace("model.language_model.", "model.").removeprefix("language_model.")
    return name


_SHARDS = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1}


def packed_target(name: str, cfg: ModelConfig) -> tuple[str, int]:
    """Our parameter name for an HF tensor name, and the row offset inside a fused projection."""
    param = name.removeprefix("model.")
    q_rows = cfg.num_heads * cfg.head_dim
    kv_rows = cfg.num_kv_heads * cfg.head_dim
    for shard, idx in _SHARDS.items():
        if f".{shard}." not in param:
            continue
        if shard in ("q_proj", "k_proj", "v_proj"):
            return param.replace(shard, "qkv_proj"), (0, q_rows, q_rows + kv_rows)[idx]
        return param.replace(shard, "gate_up_proj"), idx * cfg.intermediate_size
    return param, 0


def expected_names(cfg: ModelConfig) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.tie_word_embeddings:
        names.add("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {p + f"self_attn.{s}_proj.weight" for s in "qkvo"}
        names |= {p + f"mlp.{s}_proj.weight" for s in ("gate", "up", "down")}
        if cfg.qkv_bias:
            names |= {p + f"self_attn.{s}_proj.bias" for s in "qkv"}
    return names

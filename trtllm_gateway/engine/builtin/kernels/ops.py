"""KernelOps: the fused CUDA operations LlamaModel uses when LlamaModel.ops is set.

RMSNorm (with the residual add folded in), SiLU-mul, RoPE + KV store, paged attention that runs
the split-KV decode kernel on the leading decode rows and the packed prefill kernel on the rest
(both read the cache in place), and the GEMMs that add o_proj and down_proj into the residual
stream in place: for steps of at most 16 tokens the skinny GEMM, past that (FP8 weights) the
e4m3 GEMM of fp8_gemm.py or cuBLASLt.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from trtllm_gateway.engine.builtin.attention import AttentionMetadata
from trtllm_gateway.engine.builtin.kernels.decode_attention import decode_attention
from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_matmul
from trtllm_gateway.engine.builtin.kernels.fp8_quant import QuantRows, quantize_rows
from trtllm_gateway.engine.builtin.kernels.fused_ops import (
    rms_norm,
    rms_norm_fp8,
    silu_mul,
    silu_mul_fp8,
)
from trtllm_gateway.engine.builtin.kernels.prefill_attention import prefill_attention
from trtllm_gateway.engine.builtin.kernels.rope_store import rope_and_store
from trtllm_gateway.engine.builtin.kernels.skinny_gemm import MAX_ROWS, skinny_fp8, skinny_linear


class KernelOps:
    def __init__(self, page: int, skinny: bool = True) -> None:
        self.page = page
        self.skinny = skinny  # skinny GEMMs for steps of <= MAX_ROWS tokens

    def use_skinny(self, x: torch.Tensor) -> bool:
        """bf16/fp16 steps of at most MAX_ROWS tokens (fp32 keeps cuBLAS: tl.dot would be tf32)."""
        return self.skinny and 0 < x.shape[0] <= MAX_ROWS and x.dtype != torch.float32

    def add_linear(
        self, x: torch.Tensor | QuantRows, layer: nn.Module, residual: torch.Tensor
    ) -> None:
        """residual += layer(x), the product rounded to the residual's dtype first (HF Llama's
        rounding): an nn.Linear without bias, or an Fp8Linear (e4m3 weight with its per-channel
        weight_scale). At most MAX_ROWS rows: one skinny GEMM that adds in place; more rows of an
        Fp8Linear: fp8_matmul's GEMM adds in place; more rows of bf16: cuBLAS, then the add."""
        assert layer.bias is None
        scale = getattr(layer, "weight_scale", None)
        if self.use_skinny(residual):
            if scale is None:
                assert isinstance(x, torch.Tensor)
                skinny_linear(x, layer.weight, residual)
            else:
                skinny_fp8(x, layer.weight, scale, residual, out_dtype=residual.dtype)
        elif scale is not None:
            q = x if isinstance(x, QuantRows) else QuantRows(*quantize_rows(x))
            fp8_matmul(q.q, q.scales, layer.weight, scale, residual.dtype, residual=residual)
        else:
            assert isinstance(x, torch.Tensor)
            residual.add_(layer(x))

    def add_norm_for(
        self,
        x: torch.Tensor | QuantRows,
        layer: nn.Module,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        then: nn.Module | None,
    ) -> torch.Tensor | QuantRows:
        """residual += layer(x), then rms_norm(residual) as `then` takes it (norm_for). Where the
        GEMM cannot add in place (bf16 past MAX_ROWS rows: cuBLAS) the add is the norm's."""
        if self.use_skinny(residual) or _is_fp8(layer):
            self.add_linear(x, layer, residual)
            return self.norm_for(residual, weight, eps, then)
        assert isinstance(x, torch.Tensor)
        return self.norm_for(layer(x), weight, eps, then, residual)

    # An Fp8Linear's activations come quantized per row out of the kernel that makes them
    # (RMSNorm, SiLU-mul): one launch each instead of two.

    def norm_for(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        then: nn.Module | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | QuantRows:
        """rms_norm(x, weight, eps, residual), as `then` (the layer it feeds; None: the LM head)
        takes it."""
        if _is_fp8(then):
            return QuantRows(*rms_norm_fp8(x, weight, eps, residual))
        return rms_norm(x, weight, eps, residual)

    def silu_mul_for(self, gate_up: torch.Tensor, then: nn.Module) -> torch.Tensor | QuantRows:
        return QuantRows(*silu_mul_fp8(gate_up)) if _is_fp8(then) else silu_mul(gate_up)

    def project(self, x: torch.Tensor | QuantRows, layer: nn.Module) -> torch.Tensor:
        """layer(x) for what norm_for made."""
        if not isinstance(x, QuantRows):
            out: torch.Tensor = layer(x)
            return out
        w, scale, bias = layer.weight, layer.weight_scale, layer.bias  # an Fp8Linear's
        assert isinstance(w, torch.Tensor) and isinstance(scale, torch.Tensor)
        dt = cast(torch.dtype, layer.out_dtype)
        b = cast(torch.Tensor | None, bias)
        if x.q.shape[0] > MAX_ROWS or not self.skinny:
            return fp8_matmul(x.q, x.scales, w, scale, dt, b)
        out = skinny_fp8(x, w, scale, out_dtype=dt)
        if b is not None:
            out += b
        return out

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return rms_norm(x, weight, eps, residual)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate_up)

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
        return rope_and_store(qkv, positions, cos, sin, kv[0], kv[1], slots, nq, nkv, hd, kv_scales)

    def attention(
        self,
        q: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        scale: float,
        kv_scales: tuple[float, float] = (1.0, 1.0),
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [T, Hq, D] (rotated; its K/V already stored). Returns [T, Hq, D] contiguous, in
        `out` when given (a piecewise graph's static buffer). kv_scales: the layer's (k_scale,
        v_scale) of an e4m3 cache."""
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        nd = meta.num_decodes
        if nd:
            assert meta.decode_block_tables is not None and meta.decode_ctx_lens is not None
            decode_attention(
                q[:nd],
                kv[0],
                kv[1],
                meta.decode_block_tables,
                meta.decode_ctx_lens,
                scale,
                self.page,
                meta.decode_splits,
                out=out[:nd],
                kv_scales=kv_scales,
            )
        pf = meta.prefill
        if pf is not None:
            prefill_attention(
                q,
                kv[0],
                kv[1],
                out,
                pf.block_tables,
                pf.ctx_lens,
                pf.q_starts,
                pf.q_lens,
                pf.tiles,
                scale,
                self.page,
                kv_scales,
            )
        return out


def _is_fp8(layer: nn.Module | None) -> bool:
    return layer is not None and getattr(layer, "weight_scale", None) is not None

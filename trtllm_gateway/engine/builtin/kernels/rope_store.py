"""Fused rotary embedding and KV-cache store: one program per token of the packed qkv output.

Rotates the query heads in place inside the qkv projection output (rotate-half form, float32
math as in the portable path), rotates the key heads and writes them with the value heads to the
cache slot of the token. A negative slot (a padded CUDA-graph row) writes nothing to the cache.
An e4m3 cache (--kv-cache-dtype fp8) stores K / k_scale and V / v_scale, rounded (fp8.quantize_kv).
Launched early where the caller asks (pdl.py; the engine does not: decode_attention says why).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.kernels import pdl


@triton.jit
def _rope_store_kernel(
    qkv_ptr,
    pos_ptr,
    slot_ptr,
    cos_ptr,
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    stride_t,
    stride_cos,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    inv_k_scale,
    inv_v_scale,
    NQ: tl.constexpr,
    NKV: tl.constexpr,
    NQ_PAD: tl.constexpr,
    NKV_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    FP8_KV: tl.constexpr,
    PDL: tl.constexpr,  # launched early (pdl.early_start)
) -> None:
    pdl.early_start(PDL)
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    half: tl.constexpr = HEAD_DIM // 2
    j = tl.arange(0, HALF_PAD)
    jm = j < half
    cos = tl.load(cos_ptr + pos * stride_cos + j, mask=jm, other=0.0)[None, :]
    sin = tl.load(sin_ptr + pos * stride_cos + j, mask=jm, other=0.0)[None, :]
    row = qkv_ptr + t.to(tl.int64) * stride_t

    hq = tl.arange(0, NQ_PAD)
    qmask = (hq < NQ)[:, None] & jm[None, :]
    q1p = row + hq[:, None] * HEAD_DIM + j[None, :]
    q1 = tl.load(q1p, mask=qmask, other=0.0).to(tl.float32)
    q2 = tl.load(q1p + half, mask=qmask, other=0.0).to(tl.float32)
    tl.store(q1p, (q1 * cos - q2 * sin).to(qkv_ptr.dtype.element_ty), mask=qmask)
    tl.store(q1p + half, (q2 * cos + q1 * sin).to(qkv_ptr.dtype.element_ty), mask=qmask)

    hk = tl.arange(0, NKV_PAD)
    kmask = (hk < NKV)[:, None] & jm[None, :] & (slot >= 0)
    k1p = row + (NQ + hk[:, None]) * HEAD_DIM + j[None, :]
    k1 = tl.load(k1p, mask=kmask, other=0.0).to(tl.float32)
    k2 = tl.load(k1p + half, mask=kmask, other=0.0).to(tl.float32)
    kc = k_cache_ptr + slot * stride_ks + hk[:, None] * stride_kh + j[None, :]
    ety = k_cache_ptr.dtype.element_ty
    k_lo = k1 * cos - k2 * sin
    k_hi = k2 * cos + k1 * sin
    v1p = row + (NQ + NKV + hk[:, None]) * HEAD_DIM + j[None, :]
    vc = v_cache_ptr + slot * stride_vs + hk[:, None] * stride_vh + j[None, :]
    if FP8_KV:  # scaled, and clamped: e4m3 has no infinity to round an overflow to
        tl.store(kc, tl.clamp(k_lo * inv_k_scale, -448.0, 448.0).to(ety), mask=kmask)
        tl.store(kc + half, tl.clamp(k_hi * inv_k_scale, -448.0, 448.0).to(ety), mask=kmask)
        v_lo = tl.load(v1p, mask=kmask, other=0.0).to(tl.float32) * inv_v_scale
        v_hi = tl.load(v1p + half, mask=kmask, other=0.0).to(tl.float32) * inv_v_scale
        tl.store(vc, tl.clamp(v_lo, -448.0, 448.0).to(ety), mask=kmask)
        tl.store(vc + half, tl.clamp(v_hi, -448.0, 448.0).to(ety), mask=kmask)
    else:
        tl.store(kc, k_lo.to(ety), mask=kmask)
        tl.store(kc + half, k_hi.to(ety), mask=kmask)
        tl.store(vc, tl.load(v1p, mask=kmask, other=0.0), mask=kmask)
        tl.store(vc + half, tl.load(v1p + half, mask=kmask, other=0.0), mask=kmask)


def rope_and_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    early: bool = False,
) -> torch.Tensor:
    """qkv: [T, (Hq + 2 Hk) D], unit last stride. Returns the rotated queries, [T, Hq, D].
    kv_scales: the layer's (k_scale, v_scale) of an e4m3 cache (unused otherwise). early:
    launched early where the GPU takes it (pdl.py)."""
    t = qkv.shape[0]
    assert qkv.stride(1) == 1 and cos.stride(1) == 1
    early = early and pdl.enabled(qkv.device)
    if t:
        _rope_store_kernel[(t,)](
            qkv,
            positions,
            slots,
            cos,
            sin,
            k_cache,
            v_cache,
            qkv.stride(0),
            cos.stride(0),
            k_cache.stride(0),
            k_cache.stride(1),
            v_cache.stride(0),
            v_cache.stride(1),
            1.0 / kv_scales[0],
            1.0 / kv_scales[1],
            NQ=num_heads,
            NKV=num_kv_heads,
            NQ_PAD=triton.next_power_of_2(num_heads),
            NKV_PAD=triton.next_power_of_2(num_kv_heads),
            HEAD_DIM=head_dim,
            HALF_PAD=triton.next_power_of_2(head_dim // 2),
            FP8_KV=k_cache.dtype == torch.float8_e4m3fn,
            PDL=early,
            num_warps=4,
            launch_pdl=early,
        )
    return qkv[:, : num_heads * head_dim].view(t, num_heads, head_dim)

"""Skinny GEMM for small-batch decode (M <= 16 rows), optionally adding into the residual stream.

out[m, n] = sum_k x[m, k] * W[n, k], W an nn.Linear weight [N, K] streamed once through tensor
cores with the rows padded to 16. With a residual, the product is rounded to the model dtype and
added in place (HF Llama's rounding), which saves cuBLAS's split-K reduce kernel and the separate
add. Measured on an H200 (M = 1, graph replay): o_proj 87% of copy bandwidth against cuBLAS's
78%, down_proj 91% against 91%.

FP8 weights (--quantization fp8): W is e4m3 with one float32 scale per output channel, x is
quantized per row to e4m3 first, and the tiles meet in the FP8 tensor-core dot; both scales are
applied to the float32 sum. Widening W to bf16 in registers instead reached only 37-65% of copy
bandwidth on an H200 (the e4m3 dot: 47-88%; bench/tune_fp8_gemv.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.kernels.fp8_quant import QuantRows, quantize_rows

MAX_ROWS = 16


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    xscale_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    RESIDUAL: tl.constexpr,
    SCALED: tl.constexpr,
    WIDEN: tl.constexpr,  # e4m3 weights: 0 widen to the output dtype, 1 to fp16, 2 e4m3 dot
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    m = tl.arange(0, 16)
    mmask = m < M
    kk = tl.arange(0, BLOCK_K)
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        kmask = k < K
        xv = tl.load(
            x_ptr + m[:, None].to(tl.int64) * stride_xm + k[None, :],
            mask=mmask[:, None] & kmask[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + n[:, None].to(tl.int64) * stride_wn + k[None, :],
            mask=nmask[:, None] & kmask[None, :],
            other=0.0,
        )
        if WIDEN == 1:
            acc += tl.dot(xv.to(tl.float16), tl.trans(w.to(tl.float16)))
        elif WIDEN == 2:  # x is e4m3 too (quantized per row): the FP8 tensor-core dot
            acc += tl.dot(xv, tl.trans(w))
        else:
            acc += tl.dot(xv.to(dt), tl.trans(w.to(dt)))
    if SCALED:
        acc *= tl.load(scale_ptr + n, mask=nmask, other=0.0)[None, :]
    if WIDEN == 2:
        acc *= tl.load(xscale_ptr + m, mask=mmask, other=0.0)[:, None]
    omask = mmask[:, None] & nmask[None, :]
    optr = out_ptr + m[:, None].to(tl.int64) * stride_om + n[None, :]
    val = acc.to(dt)
    if RESIDUAL:
        r = tl.load(optr, mask=omask, other=0.0).to(tl.float32)
        val = (r + val.to(tl.float32)).to(dt)
    tl.store(optr, val, mask=omask)


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    block_n: int = 32,
    block_k: int = 256,
    num_stages: int = 4,
    num_warps: int = 4,
    widen: int = 0,
    out_dtype: torch.dtype | None = None,
    x_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [M, K], M <= 16; weight: [N, K] (e4m3 with scale: [N] float32). With residual [M, N]:
    residual += x @ W.T, returned. The output is in x's dtype."""
    m = x.shape[0]
    n, k = weight.shape
    assert m <= MAX_ROWS and x.stride(1) == 1 and weight.stride(1) == 1
    if widen == 2 and x_scale is None:  # else x is e4m3 already, quantized per row
        out_dtype = out_dtype or x.dtype
        x, x_scale = quantize_rows(x)
    dt = out_dtype or x.dtype
    out = residual if residual is not None else torch.empty((m, n), dtype=dt, device=x.device)
    if m == 0:
        return out
    _skinny_kernel[(triton.cdiv(n, block_n),)](
        x,
        weight,
        weight if scale is None else scale,
        weight if x_scale is None else x_scale,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        RESIDUAL=residual is not None,
        SCALED=scale is not None,
        WIDEN=widen,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def fp8_tiles(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, stages) for an e4m3 [n, k] weight, best of bench/tune_fp8_gemv.py on an
    H200 at 1 and 16 rows (2026-11-26): gate_up 28672x4096 88%, qkv 6144x4096 59%, down
    4096x14336 64%, o 4096x4096 47% of copy bandwidth. A narrow weight gives too few programs to
    keep enough bytes in flight; split-K would be the next step there."""
    if n >= 16384:
        return 64, 256, 3
    if k >= 8192 or n <= 4096:
        return 32, 1024, 3
    return 64, 512, 4


def skinny_fp8(
    x: torch.Tensor | QuantRows,
    weight: torch.Tensor,
    scale: torch.Tensor,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """x [M, K] bf16/fp16 (M <= 16), or already quantized per row; weight e4m3 [N, K] with scale
    [N]: x @ (W * scale).T with x rounded to e4m3 per row, in x's dtype (a QuantRows: out_dtype),
    into residual when given."""
    bn, bk, stages = fp8_tiles(*weight.shape)
    if isinstance(x, QuantRows):
        return skinny_linear(
            x.q, weight, residual, scale, bn, bk, stages, 4, 2, out_dtype, x_scale=x.scales
        )
    return skinny_linear(x, weight, residual, scale, bn, bk, stages, 4, 2, x.dtype)

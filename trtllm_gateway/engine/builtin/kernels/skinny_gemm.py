"""Skinny GEMM for small-batch decode (M <= 16 rows), optionally adding into the residual stream.

out[m, n] = sum_k x[m, k] * W[n, k], W an nn.Linear weight [N, K] streamed once through tensor
cores with the rows padded to 16. With a residual, the product is rounded to the model dtype and
added in place (HF Llama's rounding), which saves cuBLAS's split-K reduce kernel and the separate
add. Measured on an H200 (M = 1, graph replay): o_proj 87% of copy bandwidth against cuBLAS's
78%, down_proj 91% against 91%.

FP8 weights (--quantization fp8): W is e4m3 with one float32 scale per output channel; a tile is
widened to x's dtype in registers and the scale applied to the float32 sum, so a decode step
reads one byte a weight (weight-only FP8 for small batches: no activation quantization pass).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 16


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    RESIDUAL: tl.constexpr,
    SCALED: tl.constexpr,
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
        acc += tl.dot(xv.to(dt), tl.trans(w.to(dt)))
    if SCALED:
        acc *= tl.load(scale_ptr + n, mask=nmask, other=0.0)[None, :]
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
) -> torch.Tensor:
    """x: [M, K], M <= 16; weight: [N, K] (e4m3 with scale: [N] float32). With residual [M, N]:
    residual += x @ W.T, returned. The output is in x's dtype."""
    m = x.shape[0]
    n, k = weight.shape
    assert m <= MAX_ROWS and x.stride(1) == 1 and weight.stride(1) == 1
    out = residual if residual is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    _skinny_kernel[(triton.cdiv(n, block_n),)](
        x,
        weight,
        weight if scale is None else scale,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        RESIDUAL=residual is not None,
        SCALED=scale is not None,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
        num_stages=num_stages,
    )
    return out

"""Skinny GEMM (M <= 16 rows: small-batch decode) with the neighbouring small ops fused in.

out[m, n] = sum_k f(x)[m, k] * W[n, k], W an nn.Linear weight [N, K] read once, streamed
through tensor cores with the rows padded to 16. Fused prologues remove a kernel launch and a
round trip through memory each:
  PRO_NORM: f(x) = RMSNorm(x) * norm_weight (every program recomputes the row's rstd; x is small)
  PRO_SILU: x = [gate | up] of width 2K, f(x) = silu(gate) * up
and the fused epilogue EPI_RESIDUAL adds the product into the residual stream in place.
Rounding matches the unfused path (HF Llama in the model dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PRO_NONE, PRO_NORM, PRO_SILU = 0, 1, 2
MAX_ROWS = 16


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    nw_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    eps,
    PRO: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    m = tl.arange(0, 16)
    mmask = m < M
    kk = tl.arange(0, BLOCK_K)
    xrow = x_ptr + m[:, None].to(tl.int64) * stride_xm
    dt = w_ptr.dtype.element_ty
    if PRO == 1:
        ss = tl.zeros([16], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + kk
            xv = tl.load(xrow + k[None, :], mask=mmask[:, None] & (k < K)[None, :], other=0.0)
            xf = xv.to(tl.float32)
            ss += tl.sum(xf * xf, 1)
        rstd = tl.rsqrt(ss / K + eps)
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        kmask = k < K
        xmask = mmask[:, None] & kmask[None, :]
        xv = tl.load(xrow + k[None, :], mask=xmask, other=0.0)
        if PRO == 1:
            y = (xv.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32)
            nw = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
            xv = (y * nw[None, :]).to(dt)
        elif PRO == 2:
            gf = xv.to(tl.float32)
            act = (gf / (1.0 + tl.exp(-gf))).to(dt).to(tl.float32)
            up = tl.load(xrow + K + k[None, :], mask=xmask, other=0.0).to(tl.float32)
            xv = (act * up).to(dt)
        w = tl.load(
            w_ptr + n[:, None].to(tl.int64) * stride_wn + k[None, :],
            mask=nmask[:, None] & kmask[None, :],
            other=0.0,
        )
        acc += tl.dot(xv.to(dt), tl.trans(w))
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
    prologue: int = PRO_NONE,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    block_n: int = 0,
    block_k: int = 256,
    num_stages: int = 4,
) -> torch.Tensor:
    """x: [M, K] (PRO_SILU: [M, 2K]), M <= 16; weight: [N, K]. With residual: residual += out."""
    m = x.shape[0]
    n, k = weight.shape
    assert m <= MAX_ROWS and x.stride(1) == 1 and weight.stride(1) == 1
    out = residual if residual is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bn = block_n or (16 if n <= 8192 else 32)
    _skinny_kernel[(triton.cdiv(n, bn),)](
        x,
        weight,
        out,
        norm_weight if norm_weight is not None else weight,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        eps,
        PRO=prologue,
        RESIDUAL=residual is not None,
        BLOCK_N=bn,
        BLOCK_K=block_k,
        num_warps=4,
        num_stages=num_stages,
    )
    return out

"""Small fused elementwise kernels: RMSNorm, residual add + RMSNorm, SiLU(gate) * up.

Rounding follows HF Llama in the model dtype: the residual sum is rounded to the dtype before the
norm, the normalised row is rounded before the weight multiply, silu(gate) is rounded before the
product with up. One program per row (per row and column block for SiLU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    stride_x,
    stride_r,
    stride_o,
    n,
    eps,
    ADD: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mask = c < n
    x = tl.load(x_ptr + row * stride_x + c, mask=mask, other=0.0)
    if ADD:
        r = x.to(tl.float32) + tl.load(res_ptr + row * stride_r + c, mask=mask, other=0.0).to(
            tl.float32
        )
        r = r.to(x.dtype)
        tl.store(res_ptr + row * stride_r + c, r, mask=mask)
        xf = r.to(tl.float32)
    else:
        xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / n
    y = (xf * tl.rsqrt(var + eps)).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + c, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """Without residual: norm(x). With residual: residual += x in place, return norm(residual)."""
    rows, n = x.shape
    out = torch.empty_like(x)
    if rows:
        _rmsnorm_kernel[(rows,)](
            x,
            residual if residual is not None else x,
            weight,
            out,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            out.stride(0),
            n,
            eps,
            ADD=residual is not None,
            BLOCK=triton.next_power_of_2(n),
            num_warps=4 if n <= 4096 else 8,
        )
    return out


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, stride_o, n, BLOCK: tl.constexpr) -> None:
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < n
    g = tl.load(gu_ptr + row * stride_gu + c, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n + c, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + c, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] (gate first). Returns silu(gate) * up: [T, I]."""
    rows, two_n = gate_up.shape
    n = two_n // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = 1024
        _silu_mul_kernel[(rows, triton.cdiv(n, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=block, num_warps=4
        )
    return out

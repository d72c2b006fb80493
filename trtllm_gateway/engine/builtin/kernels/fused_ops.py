"""Small fused elementwise kernels: RMSNorm, residual add + RMSNorm, SiLU(gate) * up.

Rounding follows HF Llama in the model dtype: the residual sum is rounded to the dtype before the
norm, the normalised row is rounded before the weight multiply, silu(gate) is rounded before the
product with up. One program per row (per row and column block for SiLU).

The `_fp8` variants feed an Fp8Linear: the same values, rounded to the model
dtype, then quantized per row to e4m3 as fp8.quantize_rows does, in the same pass (one launch
instead of two: 96 fewer a step for an 8B model). Launched early on Hopper (pdl.py): the
quantizing variants always, plain RMSNorm where its caller asks (the engine does not:
decode_attention says why).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.fp8 import FP8
from trtllm_gateway.engine.builtin.kernels import pdl


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
    s_ptr,
    ADD: tl.constexpr,
    QUANT: tl.constexpr,  # out is e4m3, s_ptr gets the row's scale
    PDL: tl.constexpr,  # launched early (pdl.early_start)
    BLOCK: tl.constexpr,
) -> None:
    pdl.early_start(PDL)
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
    if QUANT:
        _store_e4m3_row(
            (w * y).to(x.dtype).to(tl.float32), out_ptr + row * stride_o + c, mask, s_ptr + row
        )
    else:
        tl.store(out_ptr + row * stride_o + c, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_e4m3_row(v, ptr, mask, s_ptr) -> None:
    """fp8.quantize_rows of one row held in registers (masked lanes are 0)."""
    scale = tl.maximum(tl.max(tl.abs(v), 0) / 448.0, 1e-12)
    tl.store(ptr, tl.clamp(v / scale, -448.0, 448.0).to(ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr, scale)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    early: bool = False,
) -> torch.Tensor:
    """Without residual: norm(x). With residual: residual += x in place, return norm(residual).
    early: launched early where the GPU takes it (pdl.py)."""
    out = torch.empty_like(x)
    _rms_norm(x, weight, eps, residual, out, None, early and pdl.enabled(x.device))
    return out


def rms_norm_fp8(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm(x, weight, eps, residual) quantized per row: (e4m3 [T, n], float32 scales
    [T, 1]) = fp8.quantize_rows(rms_norm(x, weight, eps, residual)): the same arithmetic, bit
    for bit but for a rare row whose sum of squares the two compiled kernels reduce in another
    order and round differently in its last bit (tests/gpu/test_fp8.py, same_quantized_rows)."""
    out = torch.empty(x.shape, dtype=FP8, device=x.device)
    scales = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)
    _rms_norm(x, weight, eps, residual, out, scales, pdl.enabled(x.device))
    return out, scales


def _rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    out: torch.Tensor,
    scales: torch.Tensor | None,
    early: bool,
) -> None:
    rows, n = x.shape
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
            scales if scales is not None else x,
            ADD=residual is not None,
            QUANT=scales is not None,
            PDL=early,
            BLOCK=triton.next_power_of_2(n),
            num_warps=4 if n <= 4096 else 8,
            launch_pdl=early,
        )


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


@triton.jit
def _silu_mul_fp8_kernel(
    gu_ptr, out_ptr, s_ptr, stride_gu, stride_o, n, PDL: tl.constexpr, BLOCK: tl.constexpr
) -> None:
    pdl.early_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mask = c < n
    g = tl.load(gu_ptr + row * stride_gu + c, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n + c, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    _store_e4m3_row(
        (act * u).to(g.dtype).to(tl.float32), out_ptr + row * stride_o + c, mask, s_ptr + row
    )


def silu_mul_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8.quantize_rows(silu_mul(gate_up)), bit for bit, in one launch (a program per row)."""
    rows, two_n = gate_up.shape
    n = two_n // 2
    out = torch.empty((rows, n), dtype=FP8, device=gate_up.device)
    scales = torch.empty((rows, 1), dtype=torch.float32, device=gate_up.device)
    if rows:
        early = pdl.enabled(gate_up.device)
        _silu_mul_fp8_kernel[(rows,)](
            gate_up,
            out,
            scales,
            gate_up.stride(0),
            out.stride(0),
            n,
            PDL=early,
            BLOCK=triton.next_power_of_2(n),
            num_warps=8,
            launch_pdl=early,
        )
    return out, scales

"""Dynamic per-token FP8 quantization of activations, one program per row (fp8.quantize_rows on
the GPU): the row's amax, its scale amax / 448, and the row divided by it as e4m3, in one pass
over the row that stays in registers (the rows of an 8B model are at most 14,336 values)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.fp8 import E4M3_MAX, FP8, MIN_SCALE
from trtllm_gateway.engine.builtin.kernels import pdl


class QuantRows(NamedTuple):
    """Activations quantized per row for an FP8 GEMM: e4m3 [M, K] and float32 scales [M, 1]."""

    q: torch.Tensor
    scales: torch.Tensor


@triton.jit
def _quant_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    K,
    stride_x,
    stride_q,
    E4M3: tl.constexpr,
    MIN_S: tl.constexpr,
    PDL: tl.constexpr,  # launched early (pdl.early_start)
    BLOCK: tl.constexpr,
) -> None:
    pdl.early_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK)
    mask = k < K
    x = tl.load(x_ptr + row * stride_x + k, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), 0) / E4M3, MIN_S)
    q = tl.clamp(x / scale, -E4M3, E4M3)
    tl.store(q_ptr + row * stride_q + k, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] (unit last stride) -> (e4m3 [M, K], float32 scales [M, 1])."""
    m, k = x.shape
    assert x.stride(1) == 1
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(k)
        early = pdl.enabled(x.device)
        _quant_rows_kernel[(m,)](
            x,
            q,
            s,
            k,
            x.stride(0),
            q.stride(0),
            E4M3=E4M3_MAX,
            MIN_S=MIN_SCALE,
            PDL=early,
            BLOCK=block,
            num_warps=8 if block >= 4096 else 4,
            launch_pdl=early,
        )
    return q, s

"""Skinny GEMM for small-batch decode (M <= 16 rows), optionally adding into the residual stream.

out[m, n] = sum_k x[m, k] * W[n, k], W an nn.Linear weight [N, K] streamed once through tensor
cores with the rows padded to 16. With a residual, the product is rounded to the model dtype and
added in place (HF Llama's rounding), which saves cuBLAS's split-K reduce kernel and the separate
add. Measured on an H200 (M = 1, graph replay): o_proj 87% of copy bandwidth against cuBLAS's
78%, down_proj 91% against 91%.

FP8 weights (--quantization fp8): W is e4m3 with one float32 scale per output channel, x is
quantized per row to e4m3 first, and the tiles meet in the FP8 tensor-core dot; both scales are
applied to the float32 sum. Widening W to bf16 in registers instead reached only 37-65% of copy
bandwidth on an H200 (the e4m3 dot: 47-88%; bench/tune_fp8_gemv.py). The e4m3 kernel launches
early on Hopper (pdl.py): it prefetches the head of its weight into L2 while the kernel before
it runs, waits for that kernel before it reads x or the residual, then lets the kernel after it
launch.

Split-K (splits > 1): each program sums one slice of K; the slices' float32 partials meet in a
workspace of the weight's own, added in slice order by the slice that finishes last, so a call
gives the same bits whichever order the slices ran in (down_proj's e4m3 weight: 4 slices).
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.kernels import pdl
from trtllm_gateway.engine.builtin.kernels.fp8_quant import QuantRows, quantize_rows
from trtllm_gateway.engine.builtin.kernels.pdl import gdc_launch_dependents, gdc_wait, prefetch_l2

MAX_ROWS = 16


@triton.jit
def _finish(
    acc,
    m,
    n,
    M,
    N,
    scale_ptr,
    xscale_ptr,
    out_ptr,
    stride_om,
    RESIDUAL: tl.constexpr,
    SCALED: tl.constexpr,
    WIDEN: tl.constexpr,
) -> None:
    """The epilogue: both scales, the rounding to the output dtype, the residual add, the store."""
    nmask = n < N
    mmask = m < M
    dt = out_ptr.dtype.element_ty
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


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    xscale_ptr,
    out_ptr,
    part_ptr,
    ticket_ptr,
    M,
    N,
    K,
    K_SPLIT,
    stride_xm,
    stride_wn,
    stride_om,
    RESIDUAL: tl.constexpr,
    SCALED: tl.constexpr,
    WIDEN: tl.constexpr,  # e4m3 weights: 0 widen to the output dtype, 1 to fp16, 2 e4m3 dot
    SPLITK: tl.constexpr,  # program_id(1) is a slice of K_SPLIT of K
    PDL: tl.constexpr,  # launched early (pdl.py): prefetch PF_LINES lines a weight row, then wait
    PF_LINES: tl.constexpr,
    LINE: tl.constexpr,  # weight elements a 128-byte line
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
    k_lo = 0
    k_hi = K
    if SPLITK:  # slices of whole blocks: the last one's tail is masked like the unsplit one's
        k_lo = tl.program_id(1) * K_SPLIT
        k_hi = k_lo + K_SPLIT
    if PDL:
        # Only the weight is read before the wait: nothing before this kernel writes it.
        if PF_LINES > 0:
            pk = k_lo + tl.arange(0, PF_LINES) * LINE
            pf = w_ptr + n[:, None].to(tl.int64) * stride_wn + pk[None, :]
            prefetch_l2(tl.where(nmask[:, None] & (pk < K)[None, :], pf, w_ptr))
        gdc_wait()
        gdc_launch_dependents()  # after the wait: at most one kernel launched ahead (pdl.py)
    for k0 in range(k_lo, k_hi, BLOCK_K):
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
    if SPLITK:
        # Each slice stores its partial sums; the last slice of a column tile to take a ticket
        # adds them in slice order (the same bits whichever finishes last), resets the ticket for
        # the next call (or graph replay) and runs the epilogue. acq_rel: the partials stored
        # before a ticket are seen by the slice that takes the last one; .cg reads them from L2.
        splits = tl.num_programs(1)
        cols = m[:, None] * N + n[None, :]
        tl.store(part_ptr + tl.program_id(1) * 16 * N + cols, acc, mask=nmask[None, :])
        ticket = tl.atomic_add(ticket_ptr + pid, 1, sem="acq_rel")
        if ticket == splits - 1:
            total = tl.zeros([16, BLOCK_N], tl.float32)
            for s in range(0, splits):
                total += tl.load(
                    part_ptr + s * 16 * N + cols,
                    mask=nmask[None, :],
                    other=0.0,
                    cache_modifier=".cg",
                )
            tl.store(ticket_ptr + pid, 0)
            _finish(
                total,
                m,
                n,
                M,
                N,
                scale_ptr,
                xscale_ptr,
                out_ptr,
                stride_om,
                RESIDUAL,
                SCALED,
                WIDEN,
            )
    else:
        _finish(acc, m, n, M, N, scale_ptr, xscale_ptr, out_ptr, stride_om, RESIDUAL, SCALED, WIDEN)


class _SplitSpace(NamedTuple):
    partials: torch.Tensor  # float32 [splits, 16, N]
    tickets: torch.Tensor  # int32 [column tiles], zero between calls


# One workspace a weight (a layer's projection), made on its first split call and dropped with
# the weight: a layer's calls run in stream order, and two engines never share a weight. Made
# outside a CUDA graph capture where the engine warms up first; made inside one, its zeroing is
# a node of the graph.
_SPACES: dict[int, _SplitSpace] = {}


def _split_space(weight: torch.Tensor, splits: int, tiles: int) -> _SplitSpace:
    key = id(weight)
    space = _SPACES.get(key)
    n = weight.shape[0]
    if space is None or space.partials.shape[0] < splits or space.tickets.shape[0] < tiles:
        space = _SplitSpace(
            torch.empty((splits, MAX_ROWS, n), dtype=torch.float32, device=weight.device),
            torch.zeros((tiles,), dtype=torch.int32, device=weight.device),
        )
        if key not in _SPACES:
            weakref.finalize(weight, _SPACES.pop, key, None)
        _SPACES[key] = space
    return space


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
    splits: int = 1,
) -> torch.Tensor:
    """x: [M, K], M <= 16; weight: [N, K] (e4m3 with scale: [N] float32). With residual [M, N]:
    residual += x @ W.T, returned. The output is in x's dtype. splits > 1: K is cut into that
    many slices of whole blocks, each a program (split-K, for weights too narrow to give every
    SM enough bytes in flight), summed in slice order by the last slice to finish."""
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
    tiles = triton.cdiv(n, block_n)
    k_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, k_split)  # no empty slice
    space = _split_space(weight, splits, tiles) if splits > 1 else None
    early = widen == 2 and pdl.enabled(x.device)  # e4m3 weights: bench/decode_chain.py
    lines = pdl.prefetch_lines(n * splits, k * weight.element_size()) if early else 0
    _skinny_kernel[(tiles, splits)](
        x,
        weight,
        weight if scale is None else scale,
        weight if x_scale is None else x_scale,
        out,
        out if space is None else space.partials,
        out if space is None else space.tickets,
        m,
        n,
        k,
        k_split,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        RESIDUAL=residual is not None,
        SCALED=scale is not None,
        WIDEN=widen,
        SPLITK=space is not None,
        PDL=early,
        PF_LINES=lines,
        LINE=pdl.LINE_BYTES // weight.element_size(),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
        launch_pdl=early,
    )
    return out


def fp8_tiles(n: int, k: int) -> tuple[int, int, int, int]:
    """(block_n, block_k, stages, splits) for an e4m3 [n, k] weight, best of
    bench/tune_fp8_gemv.py on an H200 (2026-11-29, weights cycled past L2, 1 row; 16 rows the
    same ranking): gate_up 28672x4096 89%, qkv 6144x4096 60%, o 4096x4096 49%, down 4096x14336
    75% of copy bandwidth with 4 slices of K (70% unsplit). Split-K did not help qkv or o (48%
    at 1 to 8 slices): a narrow weight's fixed cost a launch, not its programs, bounds them."""
    if n >= 16384:
        return 64, 256, 3, 1
    if k >= 8192:
        return 64, 256, 4, 4
    if n <= 4096:
        return 32, 1024, 3, 1
    return 64, 512, 4, 1


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
    bn, bk, stages, splits = fp8_tiles(*weight.shape)
    if isinstance(x, QuantRows):
        return skinny_linear(
            x.q, weight, residual, scale, bn, bk, stages, 4, 2, out_dtype, x.scales, splits
        )
    return skinny_linear(x, weight, residual, scale, bn, bk, stages, 4, 2, x.dtype, None, splits)

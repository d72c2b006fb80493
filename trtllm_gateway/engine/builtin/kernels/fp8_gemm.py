"""FP8 GEMM for decode batches of 17-256 rows and prefill chunks: out = (xq @ Wq^T) * xs * ws.

xq: e4m3 [M, K] quantized per row (scales xs [M, 1]), Wq: an Fp8Linear's e4m3 weight [N, K]
with per-channel scales ws [N]; the float32 sum is scaled by both and rounded to the output dtype
(fp8.fake_linear's arithmetic, as torch._scaled_mm with row-wise scales computes it). With a
residual, the rounded product is added in place (HF Llama's rounding, as skinny_gemm does), so
o_proj and down_proj write the residual stream themselves.

Tiles are read by the Hopper TMA (host-side tensor descriptors) into a multi-stage pipeline feeding
the e4m3 wgmma; the grid is persistent (one program an SM walking the tiles, GROUP_M rows of tiles
at a time so the weight's tiles are reused from L2).

fp8_matmul runs it where fp8_gemm_table.CONFIGS has a measured config for the weight's shape and
the row count, and torch._scaled_mm (cuBLASLt) everywhere else: the tiles cuBLASLt picks for
Llama-3.1-8B's narrow projections (o, down, qkv) at 17-256 rows leave most of the card's SMs idle
(o_proj at 256 rows: 14 us against 10 here; bench/fp8_gemm_rows.py, docs/benchmarks.md "GPU: FP8
GEMMs at decode batch sizes"). At 257-896 rows cuBLASLt is as fast or faster; at prefill's
897-8,192 one config (128 x 256 tiles) is a few percent faster than cuBLASLt's over a layer, and
o_proj and down_proj save their separate residual add there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from trtllm_gateway.engine.builtin.fp8_gemm_table import Config, config_for


@triton.jit
def _fp8_gemm_kernel(
    x_desc,
    w_desc,
    xs_ptr,
    ws_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_om,
    RESIDUAL: tl.constexpr,  # out += the rounded product (out is the residual stream)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,  # one pipelined loop over tiles and K: a tile's epilogue overlaps loads
) -> None:
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = tiles_m * tiles_n
    in_group = GROUP_M * tiles_n
    dt = out_ptr.dtype.element_ty
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
        group = tile // in_group
        first_m = group * GROUP_M
        rows = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (tile % in_group) % rows
        pid_n = (tile % in_group) // rows
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kt in range(k_tiles):
            a = x_desc.load([off_m, kt * BLOCK_K])
            b = w_desc.load([off_n, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        m = off_m + tl.arange(0, BLOCK_M)
        n = off_n + tl.arange(0, BLOCK_N)
        mmask = m < M
        nmask = n < N
        acc *= tl.load(xs_ptr + m, mask=mmask, other=0.0)[:, None]
        acc *= tl.load(ws_ptr + n, mask=nmask, other=0.0)[None, :]
        val = acc.to(dt)
        optr = out_ptr + m[:, None].to(tl.int64) * stride_om + n[None, :]
        omask = mmask[:, None] & nmask[None, :]
        if RESIDUAL:
            val = (tl.load(optr, mask=omask, other=0.0).to(tl.float32) + val.to(tl.float32)).to(dt)
        tl.store(optr, val, mask=omask)


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Hopper, and each tensor's base and row stride on 16-byte boundaries (the TMA's rule)."""
    t = tensors[0]
    if torch.cuda.get_device_capability(t.device) != (9, 0):
        return False
    return all(
        x.data_ptr() % 16 == 0 and (x.stride(0) * x.element_size()) % 16 == 0 and x.stride(1) == 1
        for x in tensors
    )


def fp8_matmul(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """(xq @ weight.T) * xs * weight_scale [+ bias] in out_dtype, by the kernel here where
    fp8_gemm_table has the shape, else torch._scaled_mm; with residual, residual += it (rounded
    to out_dtype first) and returns residual."""
    config = config_for(xq.shape[0], *weight.shape)
    if config is not None and bias is None and _tma_ready(xq, weight):
        return fp8_gemm(xq, xs, weight, weight_scale, out_dtype, config, residual)
    out = torch._scaled_mm(
        xq,
        weight.t(),
        scale_a=xs,
        scale_b=weight_scale.view(1, -1),
        bias=bias,
        out_dtype=out_dtype,
    )
    if residual is None:
        return out
    return residual.add_(out)


def fp8_gemm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    config: Config,
    residual: torch.Tensor | None = None,
    programs: int | None = None,
) -> torch.Tensor:
    """xq e4m3 [M, K], xs float32 [M, 1], weight e4m3 [N, K], weight_scale float32 [N] ->
    [M, N] in out_dtype; with residual ([M, N], out_dtype), residual += it and returns residual."""
    m, k = xq.shape
    n = weight.shape[0]
    out = (
        residual if residual is not None else torch.empty((m, n), dtype=out_dtype, device=xq.device)
    )
    c = config
    tiles = triton.cdiv(m, c.block_m) * triton.cdiv(n, c.block_n)
    if programs is None:  # one program an SM (torch caches the device's properties)
        programs = torch.cuda.get_device_properties(xq.device).multi_processor_count
    grid = min(tiles, programs)
    _fp8_gemm_kernel[(grid,)](
        TensorDescriptor.from_tensor(xq, [c.block_m, c.block_k]),
        TensorDescriptor.from_tensor(weight, [c.block_n, c.block_k]),
        xs,
        weight_scale,
        out,
        m,
        n,
        k,
        out.stride(0),
        RESIDUAL=residual is not None,
        BLOCK_M=c.block_m,
        BLOCK_N=c.block_n,
        BLOCK_K=c.block_k,
        GROUP_M=c.group_m,
        FLATTEN=c.flatten,
        num_warps=c.warps,
        num_stages=c.stages,
    )
    return out

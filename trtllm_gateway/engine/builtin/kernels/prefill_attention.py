"""Packed variable-length causal prefill over the paged KV cache (prefix hits and chunks included).

Query tokens of all prefilling sequences are packed into one [T, Hq, D] tensor. Their K/V are
already in the cache, so every key (cached prefix, earlier chunks, this chunk) is read in place
through the block table. One program computes a BLOCK_M tile of one sequence's queries for one
head, flash-attention style; query row i of a sequence sits at absolute position
ctx_len - q_len + i and sees keys 0..that position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["stride_btb"])  # the table width varies by step
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    bt_ptr,
    lens_ptr,
    qstart_ptr,
    qlen_ptr,
    tiles_ptr,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_btb,
    scale,
    v_scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    F16: tl.constexpr,  # an e4m3 cache under a 16-bit query: compute in fp16 (prefill_attention)
) -> None:
    tile = tl.program_id(0)
    h = tl.program_id(1)
    seq = tl.load(tiles_ptr + 2 * tile)
    m0 = tl.load(tiles_ptr + 2 * tile + 1)
    ctx = tl.load(lens_ptr + seq)
    q0 = tl.load(qstart_ptr + seq)
    qn = tl.load(qlen_ptr + seq)
    kvh = h // GROUP

    i = m0 + tl.arange(0, BLOCK_M)
    imask = i < qn
    pos = ctx - qn + i
    d = tl.arange(0, D_PAD)
    dmask = d < HEAD_DIM
    rows = (q0 + i).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=imask[:, None] & dmask[None, :],
        other=0.0,
    )
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    qk_scale = scale * 1.4426950408889634  # k_scale is folded into scale
    cdt = tl.float16 if F16 else q_ptr.dtype.element_ty  # what an e4m3 cache is widened to
    if F16:
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    hi = tl.minimum(ctx, ctx - qn + m0 + BLOCK_M)  # keys past the tile's last row are never seen
    offs = tl.arange(0, BLOCK_N)
    for n0 in range(0, hi, BLOCK_N):
        t = n0 + offs
        tmask = t < hi
        page = tl.load(bt_ptr + seq * stride_btb + t // PAGE, mask=tmask, other=0)
        slot = page.to(tl.int64) * PAGE + t % PAGE
        kv_mask = tmask[:, None] & dmask[None, :]
        k = tl.load(
            k_ptr + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(cdt)
        if IEEE:  # noqa: SIM108 (a constexpr branch)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = (t[None, :] <= pos[:, None]) & tmask[None, :]
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        den = den * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(cdt)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(cdt), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(cdt), v)
        m = m_new

    o = acc * (v_scale / tl.maximum(den, 1e-30))[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + h * stride_oh + d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=imask[:, None] & dmask[None, :],
    )


BLOCK_M = 64


def prefill_tiles(seq_rows: list[int], q_lens: list[int]) -> list[int]:
    """Flat [seq_row, m_start] pairs, one per BLOCK_M tile of each sequence's query tokens."""
    out: list[int] = []
    for row, n in zip(seq_rows, q_lens, strict=True):
        for m0 in range(0, n, BLOCK_M):
            out += (row, m0)
    return out


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    tiles: torch.Tensor,
    scale: float,
    page: int,
    kv_scales: tuple[float, float] = (1.0, 1.0),
) -> torch.Tensor:
    """q, out: [T, Hq, D] packed; tiles: [2 * n_tiles] int32 from prefill_tiles.
    kv_scales: (k_scale, v_scale) of an e4m3 cache (1.0 for others). An e4m3 cache is widened
    to fp16, not to a bf16 query's dtype: every e4m3 value is exact in fp16, Hopper converts a pair
    in one instruction where bf16 takes a chain, and the main loop compiled for sm_90 (Triton 3.6)
    is 638 instructions a 64-key tile against 824 (a bf16 cache: 667). The query is clamped to
    fp16's range, as decode_attention does; scores and the output accumulate in float32.

    block_tables/ctx_lens/q_starts/q_lens are indexed by the sequence rows named in tiles.
    """
    n_tiles = tiles.numel() // 2
    if n_tiles == 0:
        return out
    hq, dim = q.shape[1], q.shape[2]
    hk = k_cache.shape[1]
    ieee = q.dtype == torch.float32
    d_pad = triton.next_power_of_2(dim)
    _prefill_kernel[(n_tiles, hq)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        ctx_lens,
        q_starts,
        q_lens,
        tiles,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        scale * kv_scales[0],
        kv_scales[1],
        GROUP=hq // hk,
        HEAD_DIM=dim,
        D_PAD=d_pad,
        PAGE=page,
        BLOCK_M=BLOCK_M,
        BLOCK_N=32 if ieee else 64,
        IEEE=ieee,
        F16=k_cache.dtype == torch.float8_e4m3fn and not ieee,
        num_warps=4,
        num_stages=2,
    )
    return out

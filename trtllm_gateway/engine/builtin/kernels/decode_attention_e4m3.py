"""Decode attention over an e4m3 cache, read as 16-bit words (Hopper and Ada: sm_89+).

The same split-KV program as decode_attention's stage 1 (one program per sequence, kv head and
split; the query group padded to 16 rows; partials merged by its stage 2), with one difference:
K and V are loaded as int16 words of two e4m3 bytes (dims 2w and 2w+1) and widened to fp16 by
one asm block a pair of words (one byte permute, two `cvt.rn.f16x2.e4m3x2`) into the even dims
and the odd dims. Each product runs as two: q_even @ K_even^T + q_odd @ K_odd^T, and
P @ V_even, P @ V_odd into two accumulators stored back interleaved.

Why: with the cache typed e4m3, Triton moves the widening after the copy to the MMA operand's
layout, so the bytes of K leave shared memory one at a time (LDS.U8, and a register move to pack
each pair): the main loop of the byte-typed kernel at 64 tokens and 2 warps is 1,086 instructions
a warp, 34 a key, against 32 a key for a bf16 cache that moves twice the bytes. Typed as 16-bit
words the tiles leave shared memory by ldmatrix (transposed for V), and the loop is 721
instructions at the same tiles, 22.5 a key; 20.7 at the engine's 128-token tiles (135M's heads:
21 -> 13.4). `python -m bench.kernel_sass decode --kv fp8 [--bytes]` compiles both for sm_90 on a
CPU and counts them. The widening is exact either way: every e4m3 value is an fp16 value.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.kernels import pdl


@triton.jit
def _widen_pairs(x):
    """int16 words of two e4m3 bytes -> (low bytes, high bytes) in fp16. Two words a block: the
    permute gathers both low bytes into one half-register and both high bytes into the other, so
    each conversion makes one output register."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, $2, 0, 0x3120; mov.b32 {lo, hi}, t; "
        "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r",
        [x],
        dtype=(tl.float16, tl.float16),
        is_pure=True,
        pack=2,
    )


@triton.jit(do_not_specialize=["stride_btb", "num_splits"])
def _decode_e4m3_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_btb,
    stride_ob,
    stride_oh,
    scale,
    v_scale,
    num_splits,
    SPLIT: tl.constexpr,  # num_splits > 1
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,  # a multiple of PAGE (decode_attention launches it)
    PDL: tl.constexpr,  # launched early (pdl.early_start)
) -> None:
    pdl.early_start(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, num_splits), PAGE) * PAGE  # page-aligned share
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    WORDS: tl.constexpr = HEAD_DIM // 2
    g = tl.arange(0, GROUP_PAD)
    w = tl.arange(0, WORDS)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh + 2 * w[None, :]
    q_even = tl.load(q_row, mask=gmask[:, None], other=0.0).to(tl.float32)
    q_odd = tl.load(q_row + 1, mask=gmask[:, None], other=0.0).to(tl.float32)
    q_even = tl.clamp(q_even, -65504.0, 65504.0).to(tl.float16)
    q_odd = tl.clamp(q_odd, -65504.0, 65504.0).to(tl.float16)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    den = tl.zeros([GROUP_PAD], tl.float32)
    acc_even = tl.zeros([GROUP_PAD, WORDS], tl.float32)
    acc_odd = tl.zeros([GROUP_PAD, WORDS], tl.float32)
    offs = tl.arange(0, BLOCK_N)
    pidx = tl.arange(0, BLOCK_N // PAGE)
    in_page = tl.arange(0, PAGE)
    qk_scale = scale * 1.4426950408889634  # exp2 domain; k_scale is folded into scale
    k_words = k_ptr.to(tl.pointer_type(tl.int16)) + kvh * (stride_kh // 2)
    v_words = v_ptr.to(tl.pointer_type(tl.int16)) + kvh * (stride_vh // 2)
    for n0 in range(start, end, BLOCK_N):
        tmask = n0 + offs < end
        # the tile starts on a page (splits are page-aligned): one block-table load a page
        pages = tl.load(
            bt_ptr + b * stride_btb + n0 // PAGE + pidx, mask=n0 + pidx * PAGE < end, other=0
        )
        slot = tl.reshape(pages.to(tl.int64)[:, None] * PAGE + in_page[None, :], [BLOCK_N])
        kw = tl.load(
            k_words + slot[:, None] * (stride_ks // 2) + w[None, :], mask=tmask[:, None], other=0
        )
        k_even, k_odd = _widen_pairs(kw)
        s = tl.dot(q_even, tl.trans(k_even)) + tl.dot(q_odd, tl.trans(k_odd))
        s = tl.where(tmask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        den = den * alpha + tl.sum(p, 1)
        vw = tl.load(
            v_words + slot[:, None] * (stride_vs // 2) + w[None, :], mask=tmask[:, None], other=0
        )
        v_even, v_odd = _widen_pairs(vw)
        p16 = p.to(tl.float16)
        acc_even = acc_even * alpha[:, None] + tl.dot(p16, v_even)
        acc_odd = acc_odd * alpha[:, None] + tl.dot(p16, v_odd)
        m = m_new

    r = (v_scale / tl.maximum(den, 1e-30))[:, None]
    o_even = acc_even * r
    o_odd = acc_odd * r
    if not SPLIT:
        optr = out_ptr + b * stride_ob + heads[:, None] * stride_oh + 2 * w[None, :]
        tl.store(optr, o_even.to(out_ptr.dtype.element_ty), mask=gmask[:, None])
        tl.store(optr + 1, o_odd.to(out_ptr.dtype.element_ty), mask=gmask[:, None])
    else:
        lse = m / 1.4426950408889634 + tl.log(den)  # natural-log units; -inf for an empty split
        row = (b * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
        mptr = mid_o_ptr + row[:, None] * D_PAD + 2 * w[None, :]
        tl.store(mptr, o_even, mask=gmask[:, None])
        tl.store(mptr + 1, o_odd, mask=gmask[:, None])
        tl.store(mid_lse_ptr + row, lse, mask=gmask)


@functools.cache
def _has_e4m3_cvt(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def takes(q_dtype: torch.dtype, k_cache: torch.Tensor, page: int) -> bool:
    """Whether this kernel serves a query of q_dtype over this cache: an e4m3 cache, a 16-bit
    query, a power-of-two head dim of 32 or more (each half at least one MMA step), a
    power-of-two page, and a GPU with the conversion instruction."""
    dim = k_cache.shape[-1]
    return (
        k_cache.dtype == torch.float8_e4m3fn
        and page & (page - 1) == 0
        and q_dtype in (torch.bfloat16, torch.float16)
        and k_cache.is_cuda
        and dim >= 32
        and dim & (dim - 1) == 0
        and _has_e4m3_cvt(k_cache.device.index if k_cache.device.index is not None else 0)
    )

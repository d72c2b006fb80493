"""Decode attention over an e4m3 cache with all of a token's KV heads in one program (sm_89+).

decode_attention_e4m3's kernel runs one program per (sequence, KV head, split) and pads its query
group to the 16 rows an MMA takes. A model with few heads wastes most of that: SmolLM2-135M has
9 query heads over 3 KV heads of 64, so each program computes 16 score rows for 3 real ones, runs
the softmax over all 16, and reads a 64-byte strip of each token's 192-byte row. bench.kernel_sass
counts ~13 instructions a key a warp there, and the kernel read the cache at ~71% of the copy
bandwidth in the engine's profile (the 8B heads: ~89%): it is bound by instructions, not bytes.

Here one program per (sequence, split) takes every head. The query is laid out block-diagonally:
row r (query head r) holds its head's values in the columns of its KV head h(r) = r // group and
zeros elsewhere, so scores = Q @ K^T over a token's whole row of K are each row's own head's
scores; P @ V gives every row all heads' columns, of which the row stores its own. The MMA rows
are the query heads (9 of 16 used instead of 3), the softmax runs once a token instead of once a
KV head, and each tile load is the tokens' whole contiguous rows. K and V are read as 16-bit words
and widened as decode_attention_e4m3 does (even and odd dims, two products each).

Takes a head layout whose query heads fit the MMA's rows (<= 16) and whose token row of K is at
most 256 bytes (128 words, the column padding), with the heads contiguous in the cache.

Measured (H200, 2026-11-29; benchmarks.md, "GPU: decode attention with all of a token's KV heads
in one program"): the main loop 40.2 -> 30.8 warp-instructions a token at the 135M heads; 52.3 ->
47.6 us a layer at batch 256 and 1,536 tokens, 17.8 -> 14.4 at batch 64; a 135M decode step's
attention 1.63 -> 1.51 ms at 256 running.
"""

from __future__ import annotations

import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.kernels import pdl
from trtllm_gateway.engine.builtin.kernels.decode_attention_e4m3 import _widen_pairs

MAX_ROWS = 16  # query heads a program holds: one MMA's rows
MAX_COLS = 128  # 16-bit words of a token's K row (all KV heads), padded to a power of two


@triton.jit
def _query(q_ptr, b, stride_qb, stride_qh, r, c, GROUP: tl.constexpr, WORDS: tl.constexpr, rmask):
    """The block-diagonal query over word columns c: (even dims, odd dims) in fp16, row r's own
    head's values in the columns of its KV head, zeros elsewhere; and that ownership mask."""
    own = ((r // GROUP)[:, None] == (c // WORDS)[None, :]) & rmask[:, None]
    ptr = q_ptr + b * stride_qb + r[:, None] * stride_qh + 2 * (c % WORDS)[None, :]
    q_even = tl.clamp(tl.load(ptr, mask=own, other=0.0).to(tl.float32), -65504.0, 65504.0)
    q_odd = tl.clamp(tl.load(ptr + 1, mask=own, other=0.0).to(tl.float32), -65504.0, 65504.0)
    return q_even.to(tl.float16), q_odd.to(tl.float16), own


@triton.jit
def _tile(words_ptr, slot, row_words, c, lmask):
    """Word columns c of the tile's tokens, widened: (even dims, odd dims) in fp16."""
    w = tl.load(words_ptr + slot[:, None] * row_words + c[None, :], mask=lmask, other=0)
    return _widen_pairs(w)


@triton.jit
def _store(o_even, o_odd, ptr, r, c, WORDS: tl.constexpr, own):
    """Row r's own head's columns, interleaved back; ptr: row 0's first value, rows D apart."""
    optr = ptr + 2 * (c % WORDS)[None, :]
    tl.store(optr, o_even.to(ptr.dtype.element_ty), mask=own)
    tl.store(optr + 1, o_odd.to(ptr.dtype.element_ty), mask=own)


@triton.jit(do_not_specialize=["stride_btb", "num_splits"])
def _decode_heads_kernel(
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
    stride_vs,
    stride_btb,
    stride_ob,
    stride_oh,
    scale,
    v_scale,
    num_splits,
    SPLIT: tl.constexpr,  # num_splits > 1
    GROUP: tl.constexpr,
    NUM_HEADS: tl.constexpr,  # query heads
    ROWS: tl.constexpr,  # NUM_HEADS padded: a power of two >= 16
    HEAD_DIM: tl.constexpr,
    COLS_A: tl.constexpr,  # word columns of the row's first piece (a power of two)
    COLS_B: tl.constexpr,  # the rest of the row's words (a power of two), 0: none
    ROW_WORDS: tl.constexpr,  # a token row's words (KV heads x HEAD_DIM / 2)
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,  # a multiple of PAGE
    PDL: tl.constexpr,  # launched early (pdl.early_start)
) -> None:
    pdl.early_start(PDL)
    b = tl.program_id(0)
    split = tl.program_id(1)
    ctx = tl.load(lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, num_splits), PAGE) * PAGE  # page-aligned share
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    WORDS: tl.constexpr = HEAD_DIM // 2  # a head's words
    HAS_B: tl.constexpr = COLS_B > 0
    CB: tl.constexpr = COLS_B if HAS_B else 16  # piece B's shape when there is none (unused)
    r = tl.arange(0, ROWS)
    rmask = r < NUM_HEADS
    ca = tl.arange(0, COLS_A)
    cb = COLS_A + tl.arange(0, CB)
    qa_even, qa_odd, own_a = _query(q_ptr, b, stride_qb, stride_qh, r, ca, GROUP, WORDS, rmask)
    qb_even, qb_odd, own_b = _query(q_ptr, b, stride_qb, stride_qh, r, cb, GROUP, WORDS, rmask)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    den = tl.zeros([ROWS], tl.float32)
    acc_a_even = tl.zeros([ROWS, COLS_A], tl.float32)
    acc_a_odd = tl.zeros([ROWS, COLS_A], tl.float32)
    acc_b_even = tl.zeros([ROWS, CB], tl.float32)
    acc_b_odd = tl.zeros([ROWS, CB], tl.float32)
    offs = tl.arange(0, BLOCK_N)
    pidx = tl.arange(0, BLOCK_N // PAGE)
    in_page = tl.arange(0, PAGE)
    qk_scale = scale * 1.4426950408889634  # exp2 domain; k_scale is folded into scale
    k_words = k_ptr.to(tl.pointer_type(tl.int16))
    v_words = v_ptr.to(tl.pointer_type(tl.int16))
    for n0 in range(start, end, BLOCK_N):
        tmask = n0 + offs < end
        # the tile starts on a page (splits are page-aligned): one block-table load a page
        pages = tl.load(
            bt_ptr + b * stride_btb + n0 // PAGE + pidx, mask=n0 + pidx * PAGE < end, other=0
        )
        slot = tl.reshape(pages.to(tl.int64)[:, None] * PAGE + in_page[None, :], [BLOCK_N])
        la = tmask[:, None] & (ca < ROW_WORDS)[None, :]
        lb = tmask[:, None] & (cb < ROW_WORDS)[None, :]
        k_even, k_odd = _tile(k_words, slot, stride_ks // 2, ca, la)
        s = tl.dot(qa_even, tl.trans(k_even)) + tl.dot(qa_odd, tl.trans(k_odd))
        if HAS_B:
            k_even, k_odd = _tile(k_words, slot, stride_ks // 2, cb, lb)
            s += tl.dot(qb_even, tl.trans(k_even)) + tl.dot(qb_odd, tl.trans(k_odd))
        s = tl.where(tmask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        den = den * alpha + tl.sum(p, 1)
        p16 = p.to(tl.float16)
        v_even, v_odd = _tile(v_words, slot, stride_vs // 2, ca, la)
        acc_a_even = acc_a_even * alpha[:, None] + tl.dot(p16, v_even)
        acc_a_odd = acc_a_odd * alpha[:, None] + tl.dot(p16, v_odd)
        if HAS_B:
            v_even, v_odd = _tile(v_words, slot, stride_vs // 2, cb, lb)
            acc_b_even = acc_b_even * alpha[:, None] + tl.dot(p16, v_even)
            acc_b_odd = acc_b_odd * alpha[:, None] + tl.dot(p16, v_odd)
        m = m_new

    # each row keeps its own head's columns of P @ V
    rs = (v_scale / tl.maximum(den, 1e-30))[:, None]
    if not SPLIT:
        ptr = out_ptr + b * stride_ob + r[:, None] * stride_oh
    else:
        lse = m / 1.4426950408889634 + tl.log(den)  # natural-log units; -inf for an empty split
        row = (b * NUM_HEADS + r) * num_splits + split
        tl.store(mid_lse_ptr + row, lse, mask=rmask)
        ptr = mid_o_ptr + row[:, None] * D_PAD
    _store(acc_a_even * rs, acc_a_odd * rs, ptr, r, ca, WORDS, own_a)
    if HAS_B:
        _store(acc_b_even * rs, acc_b_odd * rs, ptr, r, cb, WORDS, own_b)


def layout(
    num_heads: int, num_kv_heads: int, head_dim: int, pad: bool = False
) -> tuple[int, int, int] | None:
    """(ROWS, COLS_A, COLS_B) of a program for this head layout: a token row's words as two
    power-of-two pieces (96 = 64 + 32; pad: one piece, the rest masked), or None where the kernel
    does not take it (more query heads than an MMA's rows, a row past 128 words, or a row that
    is not two powers of two)."""
    rows = max(16, triton.next_power_of_2(num_heads))
    words = num_kv_heads * head_dim // 2
    cols_a = triton.next_power_of_2(words) if pad else 1 << (words.bit_length() - 1)
    cols_b = max(0, words - cols_a)
    if (
        rows > MAX_ROWS
        or cols_a + cols_b > MAX_COLS
        or num_heads % num_kv_heads
        or cols_b & (cols_b - 1)
        or 0 < cols_b < 16
        or cols_a < 16
    ):
        return None
    return rows, cols_a, cols_b

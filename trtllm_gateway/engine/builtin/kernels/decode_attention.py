"""Split-KV (flash-decoding) paged attention for one new token per sequence, GQA-grouped.

Stage 1: one program per (sequence, kv head, split) walks its share of the sequence's pages,
reading K/V in place from the cache through the block table, for all the query heads of its group
at once (the group is padded to 16 rows for tl.dot). It writes a partial output and its
log-sum-exp. Stage 2 merges the splits. With one split, stage 1 writes the final output directly.
A row whose context length is 0 (a padded CUDA-graph row) gets zeros. An e4m3 cache on an
sm_89+ GPU is read by decode_attention_e4m3's kernel: the same program over 16-bit words.

The split count and the block-table width vary from step to step, so they are plain runtime
arguments that Triton does not specialize on: only "one split or several" and the split count's
power-of-two padding in stage 2 select a compiled variant, and warm_up compiles all of them when
the engine starts (a constexpr split count compiled a new kernel for every new count mid-serving:
~0.5 s each, seen in py-spy on an H100).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trtllm_gateway.engine.builtin.kernels import decode_attention_e4m3 as e4m3
from trtllm_gateway.engine.builtin.kernels import decode_attention_heads as all_heads
from trtllm_gateway.engine.builtin.kernels import pdl

# (tokens per tile, warps, pipeline stages) of decode_attention_e4m3's kernel. bench.attn_variants
# on an H200, 2026-11-28, two calls, one split: at the 8B shape, batch 256 and 1,536 tokens,
# 128 / 2 / 4 took 0.241 and 0.268 ms a layer (80% / 73% of the copy bandwidth; the byte-typed
# kernel at its best tiles 0.280 ms in the first call), first and second of nine configs; within
# 2% of the best at batch 64 and at the 135M shape (where 32 / 2 / 5 and 64 / 2 / 5 led by 1-4%).
E4M3_WORDS_CONFIG = (128, 2, 4)
# decode_attention_heads' kernel (tokens per tile, warps, stages). bench.attn_variants on an
# H200, 2026-11-29, 135M heads (9 / 3 / 64) at 1,536 tokens, nine tile configs, graph-replayed:
# 128 / 4 / 2 was first or within 1% of it at batch 256 (47.6 us a layer against the words
# kernel's 52.3), 128 (29.7 against 33.5) and 64 (14.4 against 17.8), each at choose_splits'
# all_heads count.
ALL_HEADS_CONFIG = (128, 4, 2)


@triton.jit(do_not_specialize=["stride_btb", "num_splits"])
def _decode_split_kernel(
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
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
    F16: tl.constexpr,  # an e4m3 cache under a bf16 query: compute in fp16 (see decode_attention)
    PAGED_BT: tl.constexpr,  # one block-table load per page of the tile, not one per token
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

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :],
        other=0.0,
    )
    if F16:
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    den = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    offs = tl.arange(0, BLOCK_N)
    qk_scale = scale * 1.4426950408889634  # exp2 domain; k_scale is folded into scale
    cdt = tl.float16 if F16 else q_ptr.dtype.element_ty  # what an e4m3 cache is widened to
    for n0 in range(start, end, BLOCK_N):
        t = n0 + offs
        tmask = t < end
        if PAGED_BT:  # the tile starts on a page (splits are page-aligned): its pages in a row
            pidx = tl.arange(0, BLOCK_N // PAGE)
            pages = tl.load(
                bt_ptr + b * stride_btb + n0 // PAGE + pidx, mask=n0 + pidx * PAGE < end, other=0
            )
            in_page = tl.arange(0, PAGE)
            slot = tl.reshape(pages.to(tl.int64)[:, None] * PAGE + in_page[None, :], [BLOCK_N])
        else:
            page = tl.load(bt_ptr + b * stride_btb + t // PAGE, mask=tmask, other=0)
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
        s = tl.where(tmask[None, :], s * qk_scale, float("-inf"))
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
    omask = gmask[:, None] & dmask[None, :]
    if not SPLIT:
        optr = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        lse = m / 1.4426950408889634 + tl.log(den)  # natural-log units; -inf for an empty split
        row = (b * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
        tl.store(mid_o_ptr + row[:, None] * D_PAD + d[None, :], o, mask=omask)
        tl.store(mid_lse_ptr + row, lse, mask=gmask)


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_splits,
    NUM_HEADS: tl.constexpr,
    S_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    PDL: tl.constexpr,  # launched early (pdl.early_start)
) -> None:
    pdl.early_start(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    smask = s < num_splits
    base = (b * NUM_HEADS + h) * num_splits
    lse = tl.load(mid_lse_ptr + base + s, mask=smask, other=float("-inf"))
    mx = tl.max(lse, 0)
    live = lse > float("-inf")
    w = tl.where(live, tl.exp(tl.where(live, lse - mx, 0.0)), 0.0)
    o = tl.load(mid_o_ptr + (base + s)[:, None] * D_PAD + d[None, :], mask=live[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


def choose_splits(
    batch: int, num_kv_heads: int, max_ctx: int, page: int, num_sms: int, all_heads: bool = False
) -> int:
    """Enough programs to fill the GPU twice over, but no split shorter than 4 pages.

    all_heads (decode_attention_heads' kernel, one program a sequence and split): one wave of
    two programs an SM, rounded down (its 128-token tiles in two stages take 96 KiB of shared
    memory). bench.attn_variants on an H200, 135M heads at 1,536 tokens, 2026-11-29: the best
    split count was 1 at batch 256, 2 at 128 and 4 at 64 (2 at 256 was 11% slower)."""
    most = max(1, -(-max_ctx // (4 * page)))
    if all_heads:
        want = max(1, 2 * num_sms // max(1, batch))
    else:
        want = max(1, -(-2 * num_sms // max(1, batch * num_kv_heads)))
    return int(min(want, most, 64))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    scale: float,
    page: int,
    num_splits: int,
    out: torch.Tensor | None = None,
    config: tuple[int, int, int] | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    f16: bool | None = None,
    paged_bt: bool | None = None,
    words: bool | None = None,
    heads: bool | str | None = None,
    early: bool = False,
) -> torch.Tensor:
    """q: [B, Hq, D]; caches: [slots, Hk, D]; block_tables: [B, W] int32; ctx_lens: [B] int32.
    kv_scales: (k_scale, v_scale) of an e4m3 cache (1.0 for others).
    f16: widen an e4m3 cache to fp16 and compute the products in fp16 (None: whenever the cache
    is e4m3 and q is bf16). Every e4m3 value is exact in fp16, which Hopper converts to in one
    instruction per pair; bf16 costs several. At batch 256 and 1,152 tokens on an H200 the
    e4m3 cache read at 38% of the copy bandwidth widened to bf16 and 46-48% widened to fp16
    (a bf16 cache: 88-92%): rows, not bytes, bound this kernel (bench.decode_attention_ab).
    q is clamped to fp16's range; scores and the output accumulate in float32 either way.
    paged_bt: load the block table once per page of a tile rather than once per token (None: with
    the fp16 widening). At batch 256 and 1,536 tokens on an H200 (bench.attn_variants) it took the
    e4m3 kernel from 0.364 to 0.333 ms a layer (54% -> 59% of the copy bandwidth); a bf16 cache
    went 0.410 -> 0.421 ms, so it stays off there; batch 32 unchanged.

    words: read an e4m3 cache as 16-bit words (decode_attention_e4m3; None: wherever it can).
    heads: with words, all KV heads of a sequence in one program (decode_attention_heads; None:
    takes_all_heads; "pad": one power-of-two piece of a token row, the rest masked).
    early: both kernels launched early where the GPU takes it (pdl.py). The engine does not:
    in the batch-1 chain it gained nothing beside the FP8 kernels' own early launches, and lost
    with bf16 weights (bench/decode_chain.py, 2026-11-29).

    Returns [B, Hq, D] in q's dtype. Launch shapes depend only on B and num_splits, so the call
    can be captured in a CUDA graph.
    """
    bsz, hq, dim = q.shape
    hk = k_cache.shape[1]
    group = hq // hk
    d_pad = triton.next_power_of_2(dim)
    if out is None:
        out = torch.empty((bsz, hq, dim), dtype=q.dtype, device=q.device)
    if bsz == 0:
        return out
    early = early and pdl.enabled(q.device)
    ieee = q.dtype == torch.float32
    if f16 is None:
        f16 = k_cache.dtype == torch.float8_e4m3fn and q.dtype == torch.bfloat16
    # (tokens per tile, warps, pipeline stages)
    # 64 tokens, 4 warps, 3 stages read the cache fastest at batch 64 and 256 on an H200. An
    # e4m3 cache widened to fp16 reads rows of half the bytes, so more of them must be in flight:
    # 64-token tiles, 2 warps, 5 stages (bench.attn_variants, H200, batch 256 at 1,536 tokens,
    # 2026-11-28, two calls: 0.32 ms a layer against 0.38-0.39 for the 128-token, 4-warp,
    # 3-stage tiles before; batch 32 the same within the noise; products in e4m3 instead, with
    # the query scaled to e4m3 a row, were no faster and 30x less exact).
    default = (64, 2, 5) if f16 else (64, 4, 3)
    block_n, warps, stages = config or ((32, 4, 2) if ieee or d_pad > 128 else default)
    if paged_bt is None:
        paged_bt = f16
    paged_bt = paged_bt and block_n % page == 0 and block_n >= page
    if num_splits > 1:
        mid_o = torch.empty((bsz * hq * num_splits, d_pad), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((bsz * hq * num_splits,), dtype=torch.float32, device=q.device)
    else:
        mid_o = mid_lse = out  # unused
    args = (
        q,
        k_cache,
        v_cache,
        block_tables,
        ctx_lens,
        mid_o,
        mid_lse,
        out,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        scale * kv_scales[0],
        kv_scales[1],
        num_splits,
    )
    shape = {
        "SPLIT": num_splits > 1,
        "GROUP": group,
        "GROUP_PAD": max(16, triton.next_power_of_2(group)),
        "HEAD_DIM": dim,
        "D_PAD": d_pad,
        "PAGE": page,
    }
    if words is None:
        words = e4m3.takes(q.dtype, k_cache, page)
    if heads is None:
        heads = takes_all_heads(hq, q.dtype, k_cache, v_cache, page)
    if words and heads:
        shape_heads = all_heads.layout(hq, hk, dim, heads == "pad")
        if shape_heads is None:
            raise ValueError(f"decode_attention_heads does not take {hq} / {hk} heads of {dim}")
        rows, cols_a, cols_b = shape_heads
        block_n, warps, stages = config or ALL_HEADS_CONFIG
        all_heads._decode_heads_kernel[(bsz, num_splits)](
            *args[:11], args[12], *args[14:],  # no head strides: heads contiguous
            SPLIT=num_splits > 1, GROUP=group, NUM_HEADS=hq, ROWS=rows, HEAD_DIM=dim,
            COLS_A=cols_a, COLS_B=cols_b,
            ROW_WORDS=hk * dim // 2, D_PAD=d_pad, PAGE=page, BLOCK_N=max(block_n, page),
            PDL=early, num_warps=warps, num_stages=stages, launch_pdl=early,
        )  # fmt: skip
    elif words:
        block_n, warps, stages = config or E4M3_WORDS_CONFIG
        e4m3._decode_e4m3_kernel[(bsz, hk, num_splits)](
            *args,
            **shape,
            BLOCK_N=max(block_n, page),
            PDL=early,
            num_warps=warps,
            num_stages=stages,
            launch_pdl=early,
        )
    else:
        _decode_split_kernel[(bsz, hk, num_splits)](
            *args,
            **shape,
            BLOCK_N=block_n,
            IEEE=ieee,
            F16=f16,
            PAGED_BT=paged_bt,
            PDL=early,
            num_warps=warps,
            num_stages=stages,
            launch_pdl=early,
        )
    if num_splits > 1:
        _decode_reduce_kernel[(bsz, hq)](
            mid_o,
            mid_lse,
            out,
            out.stride(0),
            out.stride(1),
            num_splits,
            NUM_HEADS=hq,
            S_PAD=max(2, triton.next_power_of_2(num_splits)),
            HEAD_DIM=dim,
            D_PAD=d_pad,
            PDL=early,
            num_warps=4,
            launch_pdl=early,
        )
    return out


def takes_all_heads(
    num_heads: int, q_dtype: torch.dtype, k_cache: torch.Tensor, v_cache: torch.Tensor, page: int
) -> bool:
    """Whether decode_attention_heads' kernel serves this layout: the words kernel's conditions,
    a head layout it takes, and each token's heads contiguous in both caches."""
    dim = k_cache.shape[2]
    return (
        e4m3.takes(q_dtype, k_cache, page)
        and all_heads.layout(num_heads, k_cache.shape[1], dim) is not None
        and k_cache.stride(1) == dim == v_cache.stride(1)
        and k_cache.stride(2) == 1 == v_cache.stride(2)
    )


def warm_up(
    k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, dtype: torch.dtype, page: int
) -> None:
    """Compile every variant decode_attention can launch for this cache and head layout: one
    split, and several for each power-of-two padding of stage 2, up to choose_splits' 64. The
    rows have context 0, so nothing is read or written but their zero outputs."""
    dim, dev = k_cache.shape[2], k_cache.device
    q = torch.zeros((1, num_heads, dim), dtype=dtype, device=dev)
    tables = torch.zeros((1, 1), dtype=torch.int32, device=dev)
    lens = torch.zeros((1,), dtype=torch.int32, device=dev)
    for splits in (1, 2, 4, 8, 16, 32, 64):
        decode_attention(q, k_cache, v_cache, tables, lens, 1.0, page, splits)

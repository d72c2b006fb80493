"""Decode attention variants, side by side with the engine's kernel as it runs (issue 39).

"e ..." are the engine's kernel at a tile config, with and without the per-page block-table load.

The engine's kernel (kernels/decode_attention.py) puts the query group in the rows of both
products: scores [group, tokens] = q @ K^T, out [group, dim] = P @ V, with the group padded to 16
rows. Variant "t" turns both products over so that the 128-wide side is the rows: scores^T
[tokens, group] = K @ q^T and out^T [dim, group] = V^T @ P^T, the shapes Hopper's warpgroup MMA
takes (M a multiple of 64, N = 16); --transposed adds it. Same inputs, same reference, timed in
turns. On an H200 at batch 256 and 1,536 tokens of e4m3 cache (2026-11-27) the turned-over form
was slower (0.43 ms at best against 0.36), and the per-page block-table load gained 8.6% (0.364
-> 0.333 ms, now the engine's default for an e4m3 cache); widening e4m3 by bit moves instead of
the conversion instruction lost 0.1 ms: the kernel is bound by instructions per element.

Timed as 20 calls replayed from one CUDA graph (bench.profile_decode.graphed): a kernel of a
135M layer (~50 us) is shorter than Triton's launch from Python, which timing single launches
measured instead (~0.1 ms a call whatever the kernel, before 2026-11-29).

  python -m bench.attn_variants --batch 256 --ctx 1536
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import triton
import triton.language as tl

from bench.decode_attention_ab import inputs, reference
from bench.device import copy_bandwidth
from bench.profile_decode import graphed
from trtllm_gateway.engine.builtin.kernels.decode_attention import (
    _decode_reduce_kernel,
    choose_splits,
    decode_attention,
)


@triton.jit(do_not_specialize=["stride_btb", "num_splits"])
def _decode_t_kernel(
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
    SPLIT: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    F16: tl.constexpr,
    PAGED_BT: tl.constexpr,  # one block-table load per page instead of per token
) -> None:
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(ctx, num_splits), PAGE) * PAGE
    start = split * per_split
    end = tl.minimum(start + per_split, ctx)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    q_t = tl.load(
        q_ptr + b * stride_qb + heads[None, :] * stride_qh + d[:, None],
        mask=gmask[None, :] & dmask[:, None],
        other=0.0,
    )  # [D_PAD, GROUP_PAD]
    if F16:
        q_t = tl.clamp(q_t.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    cdt = tl.float16 if F16 else q_ptr.dtype.element_ty
    q_t = q_t.to(cdt)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    den = tl.zeros([GROUP_PAD], tl.float32)
    acc_t = tl.zeros([D_PAD, GROUP_PAD], tl.float32)
    offs = tl.arange(0, BLOCK_N)
    qk_scale = scale * 1.4426950408889634
    for n0 in range(start, end, BLOCK_N):
        t = n0 + offs
        tmask = t < end
        if PAGED_BT:
            pidx = tl.arange(0, BLOCK_N // PAGE)
            pmask = n0 + pidx * PAGE < end
            pages = tl.load(bt_ptr + b * stride_btb + n0 // PAGE + pidx, mask=pmask, other=0)
            slot2 = pages.to(tl.int64)[:, None] * PAGE + tl.arange(0, PAGE)[None, :]
            slot = tl.reshape(slot2, [BLOCK_N])
        else:
            page = tl.load(bt_ptr + b * stride_btb + t // PAGE, mask=tmask, other=0)
            slot = page.to(tl.int64) * PAGE + t % PAGE
        kv_mask = tmask[:, None] & dmask[None, :]
        k = tl.load(
            k_ptr + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(cdt)  # [BLOCK_N, D_PAD]
        s_t = tl.dot(k, q_t)  # [BLOCK_N, GROUP_PAD]
        s_t = tl.where(tmask[:, None], s_t * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s_t, 0))
        alpha = tl.exp2(m - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        den = den * alpha + tl.sum(p_t, 0)
        v = tl.load(
            v_ptr + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(cdt)  # [BLOCK_N, D_PAD]
        acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v), p_t.to(cdt))
        m = m_new

    o_t = acc_t * (v_scale / tl.maximum(den, 1e-30))[None, :]
    omask = gmask[None, :] & dmask[:, None]
    if not SPLIT:
        optr = out_ptr + b * stride_ob + heads[None, :] * stride_oh + d[:, None]
        tl.store(optr, o_t.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        lse = m / 1.4426950408889634 + tl.log(den)
        row = (b * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
        tl.store(mid_o_ptr + row[None, :] * D_PAD + d[:, None], o_t, mask=omask)
        tl.store(mid_lse_ptr + row, lse, mask=gmask)


def decode_attention_t(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    scale: float,
    page: int,
    num_splits: int,
    out: torch.Tensor,
    config: tuple[int, int, int],
    paged_bt: bool,
) -> torch.Tensor:
    bsz, hq, dim = q.shape
    hk = k_cache.shape[1]
    group = hq // hk
    d_pad = triton.next_power_of_2(dim)
    f16 = k_cache.dtype == torch.float8_e4m3fn and q.dtype == torch.bfloat16
    block_n, warps, stages = config
    if num_splits > 1:
        mid_o = torch.empty((bsz * hq * num_splits, d_pad), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((bsz * hq * num_splits,), dtype=torch.float32, device=q.device)
    else:
        mid_o = mid_lse = out
    _decode_t_kernel[(bsz, hk, num_splits)](
        q, k_cache, v_cache, block_tables, ctx_lens, mid_o, mid_lse, out,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1), scale, 1.0, num_splits,
        SPLIT=num_splits > 1, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=dim, D_PAD=d_pad, PAGE=page, BLOCK_N=block_n, F16=f16, PAGED_BT=paged_bt,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if num_splits > 1:
        _decode_reduce_kernel[(bsz, hq)](
            mid_o, mid_lse, out, out.stride(0), out.stride(1), num_splits,
            NUM_HEADS=hq, S_PAD=max(2, triton.next_power_of_2(num_splits)),
            HEAD_DIM=dim, D_PAD=d_pad, PDL=False, num_warps=4,
        )  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ctx", type=int, default=1536)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--kv-dtype", default="fp8", choices=["fp8", "bf16"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--configs", default="64,4,3 128,4,3 64,4,4 128,4,4 128,8,3")
    p.add_argument("--splits", type=int, default=0, help="0: choose_splits' count")
    p.add_argument("--transposed", action="store_true", help="also the turned-over kernel")
    p.add_argument(
        "--words-configs",
        default="",
        help="also the e4m3 cache read as 16-bit words (decode_attention_e4m3) at these configs",
    )
    p.add_argument(
        "--heads-configs",
        default="",
        help="also decode_attention_heads (all KV heads a program) at these configs, at the "
        "split count above and at choose_splits' count for one KV head a program; 'pad' too",
    )
    p.add_argument("--heads-splits", default="", help="split counts for --heads-configs")
    p.add_argument(
        "--sequential-pages",
        action="store_true",
        help="each sequence's pages in a row (the engine's layout when blocks are freshly taken)",
    )
    args = p.parse_args()
    x = inputs(args)
    if args.sequential_pages:
        t = x["tables"]
        x["tables"] = torch.arange(t.numel(), dtype=t.dtype, device=t.device).view(t.shape)
    scale = args.head_dim**-0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = args.splits or choose_splits(args.batch, args.kv_heads, args.ctx, args.page, sms)
    kv_bytes = 2 * args.batch * args.ctx * args.kv_heads * args.head_dim * x["k"].element_size()
    bw = copy_bandwidth(torch.device("cuda"))
    ref = reference(x, 4, scale, args.page)
    out = torch.empty_like(x["q"])
    variants: dict[str, Any] = {
        "engine": lambda: decode_attention(
            x["q"], x["k"], x["v"], x["tables"], x["lens"], scale, args.page, splits, out=out
        )
    }
    for c in args.configs.split():
        cfg = tuple(int(n) for n in c.split(","))
        for paged in (False, True):
            name = f"e n{cfg[0]} w{cfg[1]} s{cfg[2]}{' pagedbt' if paged else ''}"
            variants[name] = lambda cfg=cfg, paged=paged: decode_attention(
                x["q"], x["k"], x["v"], x["tables"], x["lens"], scale, args.page, splits,
                out=out, config=cfg, paged_bt=paged, words=False,
            )  # fmt: skip
    for c in args.words_configs.split():
        cfg = tuple(int(n) for n in c.split(","))
        variants[f"words n{cfg[0]} w{cfg[1]} s{cfg[2]}"] = lambda cfg=cfg: decode_attention(
            x["q"], x["k"], x["v"], x["tables"], x["lens"], scale, args.page, splits,
            out=out, config=cfg, words=True,
        )  # fmt: skip
    one_head = choose_splits(args.batch, 1, args.ctx, args.page, sms)
    heads_splits = [int(n) for n in args.heads_splits.split()] or sorted({splits, one_head})
    for c in args.heads_configs.split():
        cfg = tuple(int(n) for n in c.split(","))
        for sp, mode in [(sp, True) for sp in heads_splits] + [(splits, "pad")]:
            name = f"heads{'-pad' if mode == 'pad' else ''} n{cfg[0]} w{cfg[1]} s{cfg[2]} x{sp}"
            variants[name] = lambda cfg=cfg, sp=sp, mode=mode: decode_attention(
                x["q"], x["k"], x["v"], x["tables"], x["lens"], scale, args.page, sp,
                out=out, config=cfg, words=True, heads=mode,
            )  # fmt: skip
    if args.transposed:
        for c in args.configs.split():
            cfg = tuple(int(n) for n in c.split(","))
            variants[f"t n{cfg[0]} w{cfg[1]} s{cfg[2]} pagedbt"] = lambda cfg=cfg: (
                decode_attention_t(
                    x["q"], x["k"], x["v"], x["tables"], x["lens"], scale, args.page, splits,
                    out, cfg, True,
                )
            )  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    for name, fn in variants.items():
        try:
            out.zero_()
            fn()
            torch.cuda.synchronize()
            diff = out[:4].double() - ref
            rows[name] = {
                "max_abs_err": float(diff.abs().max()),
                "rel_err": float(diff.norm() / ref.norm()),
                "ms": [],
            }
        except Exception as e:  # a variant Triton cannot compile is reported, not fatal
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            if "ms" in rows[name]:
                rows[name]["ms"].append(graphed(fn, 20))
    report = []
    for name, r in rows.items():
        if "ms" in r:
            ms = sorted(r["ms"])[len(r["ms"]) // 2]
            r = {
                "ms": ms,
                "of_copy_bw": kv_bytes / ms / 1e-3 / bw,
                "err": r["max_abs_err"],
                "rel_err": r["rel_err"],
            }
        report.append({"variant": name, **r})
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(0),
                "shape": vars(args),
                "splits": splits,
                "copy_TBps": bw / 1e12,
                "variants": sorted(report, key=lambda r: r.get("ms", 1e9)),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

"""Decode attention over a paged cache at a large batch: variants side by side, bytes per second.

One random paged cache (pages shuffled as a running server leaves them), one query per sequence,
every variant timed on the same inputs in turns (CUDA events, median) and compared with a float64
reference on a few sequences; bandwidth counts the K and V bytes read, against a device-to-device
copy measured in the same run.

  python -m bench.decode_attention_ab --batch 256 --ctx 1152 --kv-dtype fp8
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import torch

from bench.device import copy_bandwidth
from bench.profile_decode import timed
from trtllm_gateway.engine.builtin.kernels.decode_attention import choose_splits, decode_attention


def inputs(args: argparse.Namespace) -> dict[str, Any]:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    pages_per_seq = -(-args.ctx // args.page)
    num_pages = args.batch * pages_per_seq + 8
    shape = (num_pages * args.page, args.kv_heads, args.head_dim)
    kv_dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else torch.bfloat16
    k = (torch.randn(shape, device=dev, generator=g) * 2).to(kv_dtype)
    v = (torch.randn(shape, device=dev, generator=g) * 2).to(kv_dtype)
    order = torch.randperm(num_pages, device=dev, generator=g)[: args.batch * pages_per_seq]
    tables = order.view(args.batch, pages_per_seq).to(torch.int32)
    lens = torch.full((args.batch,), args.ctx, dtype=torch.int32, device=dev)
    q = torch.randn(args.batch, args.heads, args.head_dim, device=dev, generator=g)
    return {"q": q.to(torch.bfloat16), "k": k, "v": v, "tables": tables, "lens": lens}


def reference(x: dict[str, Any], rows: int, scale: float, page: int) -> torch.Tensor:
    """Float64 attention for the first `rows` sequences."""
    q, k, v = x["q"][:rows].double(), x["k"], x["v"]
    hq, hk = q.shape[1], k.shape[1]
    outs = []
    for b in range(rows):
        n = int(x["lens"][b])
        slots = x["tables"][b].long()[:, None] * page + torch.arange(page, device=q.device)
        slots = slots.flatten()[:n]
        kk = k[slots].double().repeat_interleave(hq // hk, dim=1)  # [n, hq, d]
        vv = v[slots].double().repeat_interleave(hq // hk, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b], kk) * scale
        outs.append(torch.einsum("hn,nhd->hd", s.softmax(-1), vv))
    return torch.stack(outs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ctx", type=int, default=1152)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--kv-dtype", default="fp8", choices=["fp8", "bf16"])
    p.add_argument("--rounds", type=int, default=3, help="turns over all variants")
    p.add_argument(
        "--configs",
        default="64,4,3 64,4,4 128,4,3 128,8,3 32,4,3 64,8,3",
        help="tokens per tile, warps, stages; space-separated",
    )
    p.add_argument("--splits", default="auto", help="split counts to try, or auto (the engine's)")
    args = p.parse_args()
    x = inputs(args)
    scale = args.head_dim**-0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    auto = choose_splits(args.batch, args.kv_heads, args.ctx, args.page, sms)
    split_counts = [auto] if args.splits == "auto" else [int(s) for s in args.splits.split(",")]
    configs = [tuple(int(n) for n in c.split(",")) for c in args.configs.split()]
    kv_bytes = 2 * args.batch * args.ctx * args.kv_heads * args.head_dim * x["k"].element_size()
    bw = copy_bandwidth(torch.device("cuda"))
    ref = reference(x, 4, scale, args.page)
    variants: dict[str, dict[str, Any]] = {}
    for f16, (block_n, warps, stages), splits in itertools.product(
        (False, True) if args.kv_dtype == "fp8" else (False,), configs, split_counts
    ):
        name = f"{'f16' if f16 else 'q-dtype'} n{block_n} w{warps} s{stages} x{splits}"
        variants[name] = {"f16": f16, "config": (block_n, warps, stages), "splits": splits}
    out = torch.empty_like(x["q"])

    def call(v: dict[str, Any]) -> None:
        decode_attention(
            x["q"], x["k"], x["v"], x["tables"], x["lens"], scale, args.page, v["splits"],
            out=out, config=v["config"], f16=v["f16"],
        )  # fmt: skip

    for v in variants.values():
        call(v)
        v["max_abs_err"] = float((out[:4].double() - ref).abs().max())
        v["ms"] = []
    for _ in range(args.rounds):
        for v in variants.values():
            v["ms"].append(timed(lambda v=v: call(v), 20))
    rows = []
    for name, v in variants.items():
        ms = sorted(v["ms"])[len(v["ms"]) // 2]
        rows.append(
            {
                "variant": name,
                "ms": ms,
                "kv_TBps": kv_bytes / ms / 1e9,
                "of_copy_bw": kv_bytes / ms / 1e-3 / bw,
                "max_abs_err": v["max_abs_err"],
            }
        )
    report = {
        "device": torch.cuda.get_device_name(0),
        "shape": vars(args),
        "engine_splits": auto,
        "kv_GB": kv_bytes / 1e9,
        "copy_TBps": bw / 1e12,
        "variants": sorted(rows, key=lambda r: r["ms"]),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

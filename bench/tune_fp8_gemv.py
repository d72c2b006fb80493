"""Tile sizes and split-K of the skinny GEMM (kernels/skinny_gemm.py) at decode batch sizes, on
the 8B projections: fraction of device-to-device copy bandwidth per config, CUDA-graph replay.

e4m3 weights (the FP8 tensor-core dot, the row quantization done before) for all four
projections; bf16 weights for o_proj and down_proj, the two the bf16 skinny path runs. Each
replay cycles through copies of the weight that together exceed the L2 cache (50 MB on an
H100/H200), as a decode step's 32 layers do. Every config's output is checked against the
unsplit default's before it is timed.

  python -m bench.tune_fp8_gemv [--rows 1 16] [--splits 1 2 4 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import torch

from bench.device import copy_bandwidth
from bench.profile_decode import graphed
from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows
from trtllm_gateway.engine.builtin.kernels.skinny_gemm import fp8_tiles, skinny_linear

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
BF16_SHAPES = ("o", "down")
TILES = [
    c
    for c in itertools.product((16, 32, 64), (256, 512, 1024), (3, 4), (4, 8))
    if c[0] * c[1] <= 32768
]
L2_BYTES = 200 << 20  # cycle through at least this many weight bytes


def copies_of(w: torch.Tensor) -> list[torch.Tensor]:
    count = max(2, -(-L2_BYTES // (w.numel() * w.element_size())))
    return [w] + [w.clone() for _ in range(count - 1)]


def run(x: Any, ws: list[torch.Tensor], scale: Any, c: tuple[int, ...], widen: int) -> Any:
    """c: (block_n, block_k, stages, warps, splits)."""
    out = None
    for w in ws:
        out = skinny_linear(
            x[0],
            w,
            scale=scale,
            block_n=c[0],
            block_k=c[1],
            num_stages=c[2],
            num_warps=c[3],
            widen=widen,
            out_dtype=torch.bfloat16,
            x_scale=x[1],
            splits=c[4],
        )
    return out


def fraction(
    x: Any, ws: list[torch.Tensor], scale: Any, c: tuple[int, ...], widen: int, bw: float
) -> float:
    """Weight bytes read per second over the copy bandwidth, one replay of all the copies."""
    nbytes = sum(w.numel() * w.element_size() for w in ws)
    return nbytes / (graphed(lambda: run(x, ws, scale, c, widen), 4) / 1e3) / bw


def sweep(
    name: str, x: Any, w: torch.Tensor, scale: Any, widen: int, splits: list[int], bw: float
) -> dict[str, Any]:
    ws = copies_of(w)
    ref = run(x, ws[:1], scale, (32, 256, 4, 4, 1), widen).float()
    res: dict[str, float] = {}
    for tile, s in itertools.product(TILES, splits):
        c = (*tile, s)
        key = "x".join(map(str, c))
        try:
            got = run(x, ws[:1], scale, c, widen).float()
            err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            if err > 2e-2:
                print(json.dumps({"proj": name, "config": key, "wrong": err}), flush=True)
                continue
            res[key] = fraction(x, ws, scale, c, widen, bw)
        except Exception as e:  # a config that does not fit in shared memory
            print("failed", name, key, repr(e)[:120], flush=True)
    best = sorted(res.items(), key=lambda kv: -kv[1])
    by_split = {
        s: max((v for k, v in res.items() if k.endswith(f"x{s}")), default=0.0) for s in splits
    }
    return {
        "best": [(k, round(v, 3)) for k, v in best[:5]],
        "best_by_split": {s: round(v, 3) for s, v in by_split.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1])
    p.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args()
    bw = copy_bandwidth(torch.device("cuda"))
    print(json.dumps({"copy_GBps": round(bw / 1e9, 1)}), flush=True)
    for rows, (name, (n, k)) in itertools.product(args.rows, SHAPES.items()):
        w16 = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        q, scale = fp8.quantize_weight(w16)
        x16 = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
        xq = quantize_rows(x16)
        bn, bk, stages, splits = fp8_tiles(n, k)
        shipped = (bn, bk, stages, 4, splits)
        row: dict[str, Any] = {"rows": rows, "proj": name, "shipped": shipped}
        row["shipped_fraction"] = round(fraction(xq, copies_of(q), scale, shipped, 2, bw), 3)
        row["fp8"] = sweep(name, xq, q, scale, 2, args.splits, bw)
        if name in BF16_SHAPES:
            row["bf16"] = sweep(name, (x16, None), w16, None, 0, args.splits, bw)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

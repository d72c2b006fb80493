"""Tile sizes of the skinny GEMM (kernels/skinny_gemm.py) for e4m3 weights at decode batch sizes,
on the 8B projections: fraction of device-to-device copy bandwidth per config, CUDA-graph replay.

  python -m bench.tune_fp8_gemv [--rows 1 16]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from bench.device import copy_bandwidth
from bench.profile_decode import graphed
from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.kernels.skinny_gemm import skinny_linear

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
CONFIGS = [
    c
    for c in itertools.product((16, 32, 64), (256, 512, 1024), (3, 4), (4, 8), (0, 1, 2))
    if c[0] * c[1] <= 32768
]


def ms_of(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, c: tuple[int, ...]
) -> float:
    """c: (block_n, block_k, stages, warps, widen); widen 2 includes the row quantization."""
    return graphed(
        lambda: skinny_linear(
            x,
            w,
            scale=scale,
            block_n=c[0],
            block_k=c[1],
            num_stages=c[2],
            num_warps=c[3],
            widen=c[4],
        )
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    args = p.parse_args()
    bw = copy_bandwidth(torch.device("cuda"))
    for rows, (name, (n, k)) in itertools.product(args.rows, SHAPES.items()):
        w16 = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        q, scale = fp8.quantize_weight(w16)
        x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
        bf16 = w16.numel() * 2 / (ms_of(x, w16, None, (32, 256, 4, 4, 0)) / 1e3) / bw
        res: dict[str, float] = {}
        for c in CONFIGS:
            try:
                res["x".join(map(str, c))] = q.numel() / (ms_of(x, q, scale, c) / 1e3) / bw
            except Exception as e:  # a config that does not fit in shared memory
                print("failed", c, repr(e)[:120])
        best = sorted(res.items(), key=lambda kv: -kv[1])[:6]
        row = {
            "rows": rows,
            "proj": name,
            "bf16_default": round(bf16, 3),
            "fp8_default": round(res.get("32x256x4x4x0", 0), 3),
            "best": [(k, round(v, 3)) for k, v in best],
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

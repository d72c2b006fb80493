"""The packed projections of one SmolLM2-135M decode step, alone: 30 layers of Q4_1 matmuls
(qkv 576 -> 960, o 576 -> 576, gate_up 576 -> 3072, down 1536 -> 576) through the CPU kernels,
with float32 activations (q4_1_mm), with int8 activations (quantize_q8 + q8_mm) and, for the
crossover, torch's dense float32 GEMM on the same weights dequantized (what PackedLinear runs above
PACKED_MAX_ROWS rows), at 1 and 2 torch threads. Every layer has its own weights (66 MB in all
packed, over the L3 cache), as in a step. Prints the best of --repeats timings per row count
and the machine's load.

  python -m bench.cpu_kernels --rows 1 8 32 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.builtin.packed_linear import pack_q4_1, q8_layout

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of one layer
LAYERS = 30


def _q4_1(n: int, k: int, seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    q = GGMLQuantizationType.Q4_1
    dense = torch.from_numpy(quants.dequantize(quants.quantize(x, q), q).copy())
    packed = pack_q4_1(dense)
    assert packed is not None
    return packed, dense


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    k = build.block_gemm()
    assert k is not None, "the CPU kernels did not build"
    one = [_q4_1(n, kk, i) for i, (n, kk) in enumerate(SHAPES)]
    f32 = [[(q.clone(), d.clone()) for (q, d), _w in one] for _ in range(LAYERS)]
    dense = [[w.clone() for _p, w in one] for _ in range(LAYERS)]
    i8 = [[q8_layout("q4_1", w) for w in layer] for layer in f32]
    for rows in args.rows:
        xs = [torch.randn(rows, kk) for _n, kk in SHAPES]
        for threads in args.threads:
            torch.set_num_threads(threads)
            best = {"float32": float("inf"), "int8": float("inf"), "dense": float("inf")}
            for _ in range(args.repeats):
                t = time.perf_counter()
                for layer in f32:
                    for (q, d), x in zip(layer, xs, strict=True):
                        k.q4_1_mm(x, q, d)
                best["float32"] = min(best["float32"], time.perf_counter() - t)
                t = time.perf_counter()
                for layer8 in i8:
                    for (w, sc), x in zip(layer8, xs, strict=True):
                        qx, s = k.quantize_q8(x)
                        k.q8_mm(qx, s, w, sc, True, False)
                best["int8"] = min(best["int8"], time.perf_counter() - t)
                t = time.perf_counter()
                for layer_w in dense:
                    for w, x in zip(layer_w, xs, strict=True):
                        torch.nn.functional.linear(x, w)
                best["dense"] = min(best["dense"], time.perf_counter() - t)
            row = {"rows": rows, "threads": threads, "variant": k.simd_path(), "q8": k.q8_path()}
            row |= {f"{a}_ms": round(v * 1e3, 2) for a, v in best.items()}
            row["load"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""FP8 GEMMs at decode batch sizes: torch._scaled_mm (cuBLASLt, row-wise scales: what Fp8Linear
runs above skinny_gemm.MAX_ROWS rows) against kernels/fp8_gemm.py at each of its configs.

python -m bench.fp8_gemm_rows [--rows 128 256 512] [--configs "128,128,128,4,8 ..."]

The weights rotate over enough copies to keep them out of L2 (as in a step, where a layer's
weights were last read a layer ago); each timing is a CUDA graph of REPS calls, the median of
--rounds replays. Prints JSON: per rows and shape, ms a call, TFLOP/s, and the error of each
kernel against a float32 reference of the same e4m3 inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from trtllm_gateway.engine.builtin.fp8 import FP8
from trtllm_gateway.engine.builtin.fp8_gemm_table import Config
from trtllm_gateway.engine.builtin.kernels.fp8_gemm import fp8_gemm
from trtllm_gateway.engine.builtin.kernels.fp8_quant import quantize_rows

# Llama-3.1-8B's projections: name -> (N, K)
SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
DEFAULT_CONFIGS = (
    "128,128,128,4,8 128,256,128,3,8 64,128,128,5,4 64,256,128,4,4 128,128,256,3,8 "
    "64,128,256,4,4 128,64,128,6,4 64,64,256,6,4 256,128,128,3,8"
)
REPS = 20
L2_BYTES = 60 << 20


def _time(fn, rounds: int) -> float:
    """ms a call: a graph of REPS calls, median of rounds replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            fn()
    times = []
    for _ in range(rounds):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / REPS)
    return statistics.median(times)


def run_shape(
    rows: int, n: int, k: int, configs: list[Config], rounds: int, np_too: bool = True
) -> dict:
    dev = torch.device("cuda")
    copies = max(2, -(-2 * L2_BYTES // (n * k)))
    weights = [(torch.randn(n, k, device=dev) * 0.05).to(FP8) for _ in range(copies)]
    wscale = torch.rand(n, device=dev) * 0.01 + 0.001
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    xq, xs = quantize_rows(x)
    ref = (xq.float() @ weights[0].float().t()) * xs * wscale[None, :]
    flops = 2 * rows * n * k
    out: dict = {"rows": rows, "N": n, "K": k, "variants": []}
    turn = [0]

    def next_w() -> torch.Tensor:
        turn[0] = (turn[0] + 1) % copies
        return weights[turn[0]]

    def cublas() -> torch.Tensor:
        return torch._scaled_mm(
            xq, next_w().t(), scale_a=xs, scale_b=wscale.view(1, -1), out_dtype=torch.bfloat16
        )

    variants: list[tuple[str, object]] = [("scaled_mm", cublas)]
    for c in configs:
        for persistent in (True, False) if np_too else (True,):
            name = f"triton {','.join(str(int(v)) for v in c)}" + ("" if persistent else " np")
            progs = None if persistent else 1 << 20

            def ours(c: Config = c, progs: int | None = progs) -> torch.Tensor:
                return fp8_gemm(xq, xs, next_w(), wscale, torch.bfloat16, c, programs=progs)

            variants.append((name, ours))
    for name, fn in variants:
        try:
            turn[0] = copies - 1  # the first call reads weights[0]: the one ref was made of
            got = fn().float()  # type: ignore[operator]
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            ms = _time(fn, rounds)  # type: ignore[arg-type]
            out["variants"].append(
                {"variant": name, "ms": ms, "tflops": flops / ms / 1e9, "rel_err": err}
            )
        except Exception as exc:  # a config that does not fit the shape or the shared memory
            out["variants"].append({"variant": name, "error": repr(exc)[:200]})
    return out


def config(text: str) -> Config:
    """'block_m,block_n,block_k,stages,warps[,group_m[,flatten]]'"""
    v = [int(x) for x in text.split(",")]
    return Config(*v[:6], *(bool(f) for f in v[6:7]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-np", action="store_true", help="persistent grids only")
    args = ap.parse_args()
    configs = [config(c) for c in args.configs.split()]
    results = []
    for rows in args.rows:
        for name in args.shapes.split(","):
            n, k = SHAPES[name]
            res = run_shape(rows, n, k, configs, args.rounds, not args.no_np)
            res["shape"] = name
            results.append(res)
            ok = [v for v in res["variants"] if "ms" in v]
            best = min(ok, key=lambda v: v["ms"])
            print(json.dumps({"rows": rows, "shape": name, "best": best}), flush=True)
    print(json.dumps({"device": torch.cuda.get_device_name(), "results": results}))


if __name__ == "__main__":
    main()

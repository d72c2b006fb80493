"""The float32 block kernels (block_gemm.cpp) of another git revision against this tree's, in
one process: both built with one variant's flags, called alternately on the step's 120 Q4_1
projections (bench.cpu_kernels' shapes, 30 layers of their own weights) and a Q8_0 slice of the
LM head, every output compared bit for bit, best of --repeats each. Both sides meet the same
load, which on a shared machine is the only fair before/after.

  python -m bench.cpu_kernels_ab --base HEAD~1 --isa avx2 --rows 1 8 32 --threads 1 2
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from bench.cpu_kernels import LAYERS, SHAPES, _q4_1
from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.builtin.packed_linear import pack_q8_0

FILES = ("block_gemm.cpp", "block_gemm.h", "simd.h", "tensor.h")  # tensor.h: since 2026-11-27
BIND = """#include <torch/extension.h>
#include "block_gemm.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_1_mm", &trtllm_gateway::q4_1_mm);
  m.def("q8_0_mm", &trtllm_gateway::q8_0_mm);
}
"""


def _sources(rev: str | None, into: Path) -> None:
    into.mkdir(parents=True)
    for f in FILES:
        if rev is None:
            text = (build.HERE / f).read_text()
        else:
            rel = (build.HERE / f).relative_to(Path.cwd())
            shown = subprocess.run(
                ["git", "show", f"{rev}:{rel}"], check=False, capture_output=True, text=True
            )
            if shown.returncode != 0 and f == "tensor.h":
                continue  # a revision before tensor.h: its headers include torch/extension.h
            shown.check_returncode()
            text = shown.stdout
        (into / f).write_text(text)
    (into / "bind.cpp").write_text(BIND)


def _build(name: str, src: Path, isa: str) -> ModuleType:
    from torch.utils import cpp_extension

    return cpp_extension.load(  # type: ignore[no-any-return]
        name=name,
        sources=[str(src / "block_gemm.cpp"), str(src / "bind.cpp")],
        extra_cflags=["-O3", "-fopenmp", *build.ISAS[isa].flags],
        build_directory=str(src),
        verbose=False,
    )


def _lm_head_slice(n: int = 8192, k: int = 576) -> tuple[torch.Tensor, torch.Tensor]:
    x = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32) * 0.05
    q = GGMLQuantizationType.Q8_0
    packed = pack_q8_0(torch.from_numpy(quants.dequantize(quants.quantize(x, q), q).copy()))
    assert packed is not None
    return packed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True, help="git revision to compare this tree against")
    p.add_argument("--isa", default=build.select_isa(), choices=build.supported())
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=11)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kernels-ab-"))
    sides: dict[str, ModuleType] = {}
    for i, (label, rev) in enumerate((("base", args.base), ("tree", None))):
        _sources(rev, tmp / label)
        sides[label] = _build(f"kernels_ab_{i}", tmp / label, args.isa)
    one = [_q4_1(n, k, i) for i, (n, k) in enumerate(SHAPES)]
    f32 = [[(q.clone(), d.clone()) for (q, d), _w in one] for _ in range(LAYERS)]
    lm = _lm_head_slice()
    for rows in args.rows:
        xs = [torch.randn(rows, k) for _n, k in SHAPES]
        xl = torch.randn(rows, lm[0].shape[1])
        for threads in args.threads:
            torch.set_num_threads(threads)
            best = {(s, what): float("inf") for s in sides for what in ("q4_1", "lm")}
            for _ in range(args.repeats):
                outs: dict[str, list[torch.Tensor]] = {}
                for label, k in sides.items():
                    t = time.perf_counter()
                    out = [
                        k.q4_1_mm(x, q, d)
                        for layer in f32
                        for (q, d), x in zip(layer, xs, strict=True)
                    ]
                    best[label, "q4_1"] = min(best[label, "q4_1"], time.perf_counter() - t)
                    t = time.perf_counter()
                    out.append(k.q8_0_mm(xl, *lm))
                    best[label, "lm"] = min(best[label, "lm"], time.perf_counter() - t)
                    outs[label] = out
                assert all(map(torch.equal, outs["base"], outs["tree"])), "the bits differ"
            ms = {key: round(v * 1e3, 2) for key, v in best.items()}
            print(
                f"isa {args.isa} rows {rows} threads {threads}: 120 Q4_1 projections "
                f"{ms['base', 'q4_1']} -> {ms['tree', 'q4_1']} ms, Q8_0 LM-head slice (8192 "
                f"columns) {ms['base', 'lm']} -> {ms['tree', 'lm']} ms (same bits)",
                flush=True,
            )


if __name__ == "__main__":
    main()

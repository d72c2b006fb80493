"""Where a CPU decode step's time goes: each compiled kernel and each torch op, ms a step.

Loads the engine as bench.cpu_step does (load, admit and step in this one thread), prefills B
random 128-token prompts, then runs decode steps under cProfile. The C++ kernels (cpu_kernels/)
and torch's ops are builtins to cProfile, so each call is timed whole (its OpenMP threads
included) and grouped by name; the packed projections and the LM head are told apart by the
kernel they call (q4_1_mm vs q8_0_mm). "python" is what is left of the step: the interpreter
running model.py, the scheduler and the sampler. cProfile costs about 1 us a call, so the step
total is also taken without it (the minimum of --repeats timed runs: this is a shared machine).

  python -m bench.cpu_profile --batch 1 8 32 [--packed-weights int8] [--steps 20]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from pathlib import Path
from typing import Any

from bench.offline import random_prompts
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.loader import load
from trtllm_gateway.engine.builtin.parts import assemble
from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams

# The compiled kernels by cProfile name; every other builtin (torch ops) keeps its own name.
KERNELS = {
    "q4_1_mm": "Q4_1 projections (float32 activations)",
    "q8_0_mm": "Q8_0 LM head (float32 activations)",
    "q8_mm": "int8-activation matmuls",
    "quantize_q8": "quantize activations to int8",
    "decode_attention": "decode attention",
    "rms_norm": "RMSNorm",
    "rope_store": "RoPE + KV store",
    "silu_mul": "SiLU * up",
}
STACK = "decoder stack (one C++ call: 30 layers' projections, attention, norms, RoPE)"


def decoder_stack(stack: Any, *args: Any) -> Any:
    """The DecodeStack call as a Python function: cProfile does not see a pybind method of an
    object as a builtin, so its time would count as its caller's Python."""
    return stack.forward(*args)


class _TimedStack:
    def __init__(self, stack: Any) -> None:
        self._stack = stack

    def forward(self, *args: Any) -> Any:
        return decoder_stack(self._stack, *args)


def _builtin_name(name: str) -> str:
    """'<built-in method pkg.q4_1_mm>' -> 'q4_1_mm'; "<method 'add_' of ...>" -> 'add_'."""
    if name.startswith("<method '"):
        return name.split("'")[1]
    return name.removeprefix("<built-in method ").rstrip(">").split(" ")[0].split(".")[-1]


def _group(stats: pstats.Stats) -> dict[str, float]:
    """Seconds of own time per group: each kernel, each other builtin (torch ops), and Python."""
    out: dict[str, float] = {}
    for (filename, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        if filename == "~":  # a builtin: the C++ kernels and torch's ops
            method = _builtin_name(name)
            key = KERNELS.get(method, f"builtin: {method}")
        elif name == "decoder_stack":
            key = STACK
        else:
            key = "python"
        out[key] = out.get(key, 0.0) + row[2]  # tottime: own time, callees excluded
    return out


def profile(batch: int, steps: int, repeats: int, packed: str) -> dict[str, Any]:
    engine = EngineConfig(device="cpu", dtype="float32", packed_weights=packed)  # type: ignore[arg-type]
    lm = load(engine)
    stack = lm.model.cpu_decode
    if stack is not None:
        stack._stack = _TimedStack(stack._stack)  # type: ignore[attr-defined]
    parts = assemble(lm, BuiltinConfig(engine), KvEventLog(engine.block_size))
    st = parts.stepper
    total = 3 + steps * (repeats + 1)
    sp = SamplingParams(max_tokens=total + 8, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(random_prompts(batch, 128, parts.info.vocab_size, 0)):
        st.add(parts.sequences.build(GenerateRequest(f"s{i}", p, sp)))
    for _ in range(3):  # prefill, then warm decode steps
        st.step()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            st.step()
        runs.append((time.perf_counter() - t0) / steps * 1e3)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        st.step()
    prof.disable()
    groups = _group(pstats.Stats(prof))
    step_ms = min(runs)
    rows = {k: v / steps * 1e3 for k, v in sorted(groups.items(), key=lambda kv: -kv[1])}
    return {"batch": batch, "packed_weights": packed, "step_ms": step_ms, "runs_ms": runs} | {
        "profiled_step_ms": sum(rows.values()),
        "split_ms": {k: round(v, 3) for k, v in rows.items() if v >= 0.05},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--packed-weights", choices=["auto", "int8", "off"], default="auto")
    args = p.parse_args()
    for b in args.batch:
        load_avg = (
            Path("/proc/loadavg").read_text().split()[:3] if os.path.exists("/proc/loadavg") else []
        )
        row = profile(b, args.steps, args.repeats, args.packed_weights)
        print(json.dumps(row | {"load": " ".join(load_avg)}), flush=True)


if __name__ == "__main__":
    main()

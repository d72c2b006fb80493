"""Decode-step time of the engine on CPU at a given batch and dtype (no HTTP, no asyncio).

Used to pick the CPU dtype (`--dtype auto`): B sequences of random 128-token prompts are prefilled,
then decode steps are timed through the stepper, the way the engine thread runs them.

  python -m bench.cpu_step --dtype float32 --batch 1 8 32 --packed-weights auto off
  python -m bench.cpu_step --dtype bfloat16 --batch 1 8 32 [--quantization int8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import torch

from bench.offline import random_prompts
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.loader import load
from trtllm_gateway.engine.builtin.parts import assemble
from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams


def step_ms(
    dtype: str, batch: int, steps: int, quantization: str = "none", packed: str = "auto"
) -> float:
    """Load, admit and step in this one thread, as the engine's own thread does (a model loaded
    in another thread leaves a second set of OpenMP threads, which slows every step)."""
    engine = EngineConfig(
        device="cpu",
        dtype=dtype,  # type: ignore[arg-type]
        quantization=quantization,  # type: ignore[arg-type]
        packed_weights=packed,  # type: ignore[arg-type]
    )
    parts = assemble(load(engine), BuiltinConfig(engine), KvEventLog(engine.block_size))
    st = parts.stepper
    sp = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(random_prompts(batch, 128, parts.info.vocab_size, 0)):
        st.add(parts.sequences.build(GenerateRequest(f"s{i}", p, sp)))
    for _ in range(3):  # prefill, then warm decode steps
        st.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        st.step()
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--quantization", choices=["none", "int8"], default="none")
    p.add_argument("--packed-weights", choices=["auto", "int8", "off"], nargs="+", default=["auto"])
    args = p.parse_args()
    for d, packed, b in itertools.product(args.dtype, args.packed_weights, args.batch):
        load = (
            Path("/proc/loadavg").read_text().split()[:3] if os.path.exists("/proc/loadavg") else []
        )
        ms = step_ms(d, b, args.steps, args.quantization, packed)
        row = {"dtype": d, "quantization": args.quantization, "packed_weights": packed}
        row |= {"batch": b, "ms_per_step": ms, "tok_s": b / ms * 1e3}
        row |= {"threads": torch.get_num_threads(), "load": " ".join(load)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

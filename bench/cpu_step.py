"""Decode-step time of the engine on CPU at a given batch and dtype (no HTTP, no asyncio).

Used to pick the CPU dtype (`--dtype auto`): B sequences of random 128-token prompts are prefilled,
then decode steps are timed through the stepper, the way the engine thread runs them.

  python -m bench.cpu_step --dtype bfloat16 --batch 1 8 32 [--quantization int8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import torch

from bench.offline import random_prompts
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.engine import BuiltinEngine
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams


async def step_ms(dtype: str, batch: int, steps: int, quantization: str = "none") -> float:
    settings = Settings(device="cpu", dtype=dtype, quantization=quantization)  # type: ignore[arg-type]
    engine = BuiltinEngine(settings)
    await engine.start()
    st = engine._stepper
    assert st is not None
    await engine.stop()  # drive the stepper from this thread instead of the engine loop
    engine._state = "ready"
    sp = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(random_prompts(batch, 128, engine.info.vocab_size, 0)):
        st.add(engine._admit(GenerateRequest(f"s{i}", p, sp)))
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
    args = p.parse_args()
    for d in args.dtype:
        for b in args.batch:
            load = (
                Path("/proc/loadavg").read_text().split()[:3]
                if os.path.exists("/proc/loadavg")
                else []
            )
            ms = asyncio.run(step_ms(d, b, args.steps, args.quantization))
            row = {"dtype": d, "quantization": args.quantization, "batch": b, "ms_per_step": ms}
            row |= {"tok_s": b / ms * 1e3}
            row |= {"threads": torch.get_num_threads(), "load": " ".join(load)}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""The CPU thread policy (engine/builtin/cpu_threads.py) A/B: decode steps of one engine,
alternating between rounds that pin the policy contended (calls under MIN_PARALLEL_FMAS on one
thread) and free (every call on both threads), so both sides meet the same load. Prints ms a
step (median and min of the rounds) and the run-queue wait share of each round (run_queue.py).

  GATEWAY_CPU_ISA=avx2 python -m bench.cpu_policy --batch 1 8 32 [--packed-weights int8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.offline import random_prompts
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin import cpu_threads
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.loader import load
from trtllm_gateway.engine.builtin.parts import assemble
from trtllm_gateway.engine.builtin.run_queue import RunQueueWait, waited_ns
from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams


class _Pinned(RunQueueWait):
    """A gauge that never reports, so the policy keeps the state it is given."""

    def share(self) -> float | None:
        return None


def compare(batch: int, rounds: int, steps: int, packed: str) -> dict[str, Any]:
    engine = EngineConfig(device="cpu", dtype="float32", packed_weights=packed)  # type: ignore[arg-type]
    parts = assemble(load(engine), BuiltinConfig(engine), KvEventLog(engine.block_size))
    st = parts.stepper
    sp = SamplingParams(max_tokens=2 * rounds * steps + 8, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(random_prompts(batch, 128, parts.info.vocab_size, 0)):
        st.add(parts.sequences.build(GenerateRequest(f"s{i}", p, sp)))
    for _ in range(3):  # prefill, then warm decode steps
        st.step()
    policy = cpu_threads.ThreadPolicy(_Pinned())
    cpu_threads.POLICY = policy  # threads_for reads it at each call
    ms: dict[str, list[float]] = {"contended": [], "free": []}
    wait: dict[str, list[float]] = {"contended": [], "free": []}
    for r in range(rounds):
        for mode in ("contended", "free") if r % 2 == 0 else ("free", "contended"):
            policy.contended = mode == "contended"
            t0, w0 = time.perf_counter(), waited_ns() or 0
            for _ in range(steps):
                st.step()
            dt = time.perf_counter() - t0
            ms[mode].append(dt / steps * 1e3)
            wait[mode].append(round(((waited_ns() or 0) - w0) / 1e9 / dt, 2))
    return (
        {"batch": batch, "packed_weights": packed}
        | {
            f"{m}_ms": {"median": round(statistics.median(v), 1), "min": round(min(v), 1)}
            for m, v in ms.items()
        }
        | {"wait_share": wait}
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--packed-weights", choices=["auto", "int8"], default="auto")
    args = p.parse_args()
    for b in args.batch:
        row = compare(b, args.rounds, args.steps, args.packed_weights)
        row["load"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

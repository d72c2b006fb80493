"""Decode steps with the one-call decoder stack (cpu_decode.py) against the eager forward, in one
process: the same loaded model, kernels and threads; only LlamaModel.cpu_decode differs.

Each round runs both modes in a rotating order: a fresh batch of B random 128-token prompts,
prefilled, then --tokens greedy decode steps through the stepper (as the engine thread runs them),
each step timed. Per mode and round: the median step; per round: the ratio eager / stack. Prints
the median of the rounds' ratios with their min-max, and the load: on a shared machine only the
interleaved ratio is worth reading.

  python -m bench.cpu_decode_ab --batch 1 --tokens 128 --rounds 6
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
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.loader import load
from trtllm_gateway.engine.builtin.parts import assemble
from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams


def decode_run(parts: Any, batch: int, tokens: int, seed: int, tag: str) -> tuple[float, list[int]]:
    """The median decode step (ms) of one fresh batch, and the first sequence's greedy tokens."""
    st = parts.stepper
    sp = SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True)
    seqs = []
    for i, p in enumerate(random_prompts(batch, 128, parts.info.vocab_size, seed)):
        seq = parts.admission.sequence(GenerateRequest(f"{tag}-{i}", p, sp))
        seqs.append(seq)
        st.add(seq)
    st.step()  # the prefill (and first token)
    times = []
    for _ in range(tokens):
        t = time.perf_counter()
        st.step()
        times.append(time.perf_counter() - t)
    while not all(s.is_finished for s in seqs):  # max_tokens: at most one step more
        st.step()
    return statistics.median(times) * 1e3, list(seqs[0].token_ids[128:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    engine = EngineConfig(device="cpu", dtype="float32")
    loaded = load(engine)
    parts = assemble(loaded, BuiltinConfig(engine), KvEventLog(engine.block_size))
    model = loaded.model
    stack = model.cpu_decode
    if stack is None:
        raise SystemExit("no one-call decoder stack on this build (packed float32 weights only)")
    modes = {"stack": stack, "eager": None}
    decode_run(parts, args.batch, 8, 0, "warm")
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        got: dict[str, Any] = {"round": r, "load": Path("/proc/loadavg").read_text().split()[0]}
        tokens = {}
        for name in order:
            model.cpu_decode = modes[name]
            got[name + "_ms"], tokens[name] = decode_run(
                parts, args.batch, args.tokens, 1000 * (r + 1), f"{name}{r}"
            )
        model.cpu_decode = stack
        got["ratio"] = got["eager_ms"] / got["stack_ms"]
        got["same_tokens"] = tokens["stack"] == tokens["eager"]
        rows.append(got)
        print(json.dumps(got), flush=True)
    ratios = [row["ratio"] for row in rows]
    print(
        json.dumps(
            {
                "batch": args.batch,
                "tokens": args.tokens,
                "stack_ms_median": statistics.median(row["stack_ms"] for row in rows),
                "eager_ms_median": statistics.median(row["eager_ms"] for row in rows),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "same_tokens": all(row["same_tokens"] for row in rows),
            }
        )
    )


if __name__ == "__main__":
    main()

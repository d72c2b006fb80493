"""Where a prefill step goes: --prompts prompts of --input-len tokens prefilled in one step, the
GPU's kernels grouped by name.

The EngineCore is stepped in process (as bench.profile_step does), each round adding fresh prompts
that ask for one token, so a round is the prefill step and the one decode step after it. Rounds
are timed wall to wall (a CUDA synchronize at each end), then --profile-rounds more run under
torch.profiler recording every CUDA kernel. One JSON report; on a CPU the kernel table is left out.

With --running N, N requests of --input-len tokens decode throughout (started first, and warmed
for --warm-tokens tokens each), so each round's prefill step is a mixed step, as a serving
engine's are when prompts arrive while others decode; decode-only steps of the same batch are
timed before the rounds (decode_step_ms), so a round's cost beyond its decode steps reads apart.

  python -m bench.profile_prefill --model trtllm_gateway/config/models/llama-3.1-8b.json \\
      --load-format dummy --quantization fp8 --kv-cache-dtype fp8 --prompts 8 --input-len 1024
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from typing import Any

from bench.offline import engine_config_from, random_prompts
from bench.offline import parser as offline_parser
from bench.profile_step import kernel_table, one_iteration, start_running
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.protocol import SamplingParams
from trtllm_gateway.engine.transport.loop import settle_heap
from trtllm_gateway.engine.transport.messages import Add

MAX_STEPS = 50  # a round that has not ended by then is a bug, not a slow step


def prefill_round(core: EngineCore, prompts: int, input_len: int, seed: int) -> tuple[float, int]:
    """Fresh prompts (no prefix-cache hit), one token each, stepped until all ended: (wall ms,
    steps). Requests already running go on decoding beside them."""
    sync = _sync()
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    pending = set()
    for i, ids in enumerate(random_prompts(prompts, input_len, core.info.vocab_size, seed)):
        pending.add(f"r{seed}-{i}")
        core.handle(Add(request_id=f"r{seed}-{i}", prompt_token_ids=ids, sampling=sp), [])
    sync()
    t0, steps = time.perf_counter(), 0
    while pending:
        core.step()
        for request_id, ev in core.batch().events:
            if ev.finish_reason is not None:
                pending.discard(request_id)
        steps += 1
        if steps > MAX_STEPS:
            raise RuntimeError(f"a prefill round still running after {MAX_STEPS} steps")
    sync()
    return (time.perf_counter() - t0) * 1e3, steps


def start_decodes(core: EngineCore, args: argparse.Namespace) -> float:
    """--running requests decoding, each --warm-tokens in; returns a decode-only step's wall ms
    (the median of ten, each synchronized)."""
    counts = start_running(core, args)
    sync, walls = _sync(), []
    for _ in range(10):
        sync()
        t0 = time.perf_counter()
        one_iteration(core, counts)
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(walls)


def profile(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    core = EngineCore(BuiltinConfig(engine_config_from(args)))
    core.load(lambda detail: None)
    settle_heap()  # as a core in its own process does after its load
    decode_ms = start_decodes(core, args) if args.running else 0.0
    seed = 1000
    for _ in range(args.warmup_rounds):
        prefill_round(core, args.prompts, args.input_len, seed)
        seed += 1
    rounds = []
    for _ in range(args.rounds):
        rounds.append(prefill_round(core, args.prompts, args.input_len, seed))
        seed += 1
    walls = [ms for ms, _ in rounds]
    report: dict[str, Any] = {
        "settings": vars(args),
        "tokens_a_round": args.prompts * args.input_len,
        "round_ms": [round(ms, 3) for ms in walls],
        "round_ms_p50": statistics.median(walls),
        "steps_a_round": [n for _, n in rounds],
        "prefill_tok_s": args.prompts * args.input_len / statistics.median(walls) * 1e3,
    }
    if args.running:
        report["running"] = core.health().running  # the decodes still beside the last round
        report["decode_step_ms"] = decode_ms
        # a round is its prefill (mixed) step and decode steps after it: the rest is the mix's
        steps = statistics.median(n for _, n in rounds)
        report["mixed_step_ms_est"] = statistics.median(walls) - (steps - 1) * decode_ms
    if torch.cuda.is_available() and core.loaded.device.type == "cuda":
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
        with prof:
            for _ in range(args.profile_rounds):
                prefill_round(core, args.prompts, args.input_len, seed)
                seed += 1
        report["gpu"] = kernel_table(prof, args.profile_rounds, args.top)  # per round
    return report


def _sync() -> Any:
    import torch

    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def parser() -> argparse.ArgumentParser:
    p = offline_parser()
    p.description = __doc__
    p.add_argument("--prompts", type=int, default=8, help="prompts a round: one prefill step")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds")
    p.add_argument("--warmup-rounds", type=int, default=3)
    p.add_argument("--profile-rounds", type=int, default=3, help="rounds under torch.profiler")
    p.add_argument("--top", type=int, default=25)
    p.add_argument(
        "--running", type=int, default=0, help="requests decoding beside the rounds (mixed steps)"
    )
    p.add_argument("--warm-tokens", type=int, default=32, help="tokens each has before the rounds")
    p.set_defaults(input_len=1024, max_batch_size=256, max_num_tokens=8192)
    return p


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(profile(parser().parse_args()), indent=1, default=str))


if __name__ == "__main__":
    main()

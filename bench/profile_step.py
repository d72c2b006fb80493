"""Where a large-batch step goes: the GPU's kernels and the engine core's host side, at N running.

The EngineCore is driven here as its loop drives it (step, batch, the batch encoded for the
socket), with no client in the process: N requests added at once and left to reach steady
decode, then --steps steps under cProfile (the host's functions), then --steps steps timed with
torch.profiler recording every CUDA kernel. The thread's CPU time is reported beside its wall
time (a CUDA synchronize spins, so CPU time counts waiting on the GPU too). One JSON report.

  python -m bench.profile_step --model trtllm_gateway/config/models/llama-3.1-8b.json \\
      --load-format dummy --quantization fp8 --kv-cache-dtype fp8 --running 256
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import pstats
import statistics
import time
from typing import Any

from bench.offline import engine_config_from, random_prompts, step_roofline
from bench.offline import parser as offline_parser
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.protocol import SamplingParams
from trtllm_gateway.engine.transport.loop import settle_heap
from trtllm_gateway.engine.transport.messages import Add, encode


def kernel_table(prof: Any, steps: int, top: int) -> dict[str, Any]:
    """Every CUDA kernel of the window, grouped by name, per step."""
    totals: dict[str, list[float]] = {}
    for ev in prof.events():
        if getattr(ev, "device_type", None) is None or str(ev.device_type) != "DeviceType.CUDA":
            continue
        t = totals.setdefault(ev.name, [0.0, 0.0])
        t[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        t[1] += 1
    busy_us = sum(v[0] for v in totals.values())
    rows = [
        {
            "kernel": name[:120],
            "us_per_step": us / steps,
            "launches_per_step": n / steps,
            "share": us / busy_us if busy_us else 0.0,
        }
        for name, (us, n) in sorted(totals.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    ]
    return {
        "gpu_busy_ms_per_step": busy_us / steps / 1e3,
        "kernels": rows,
        "idle": idle(prof, steps),
    }


def idle(prof: Any, steps: int, long_us: float = 20.0) -> dict[str, Any]:
    """Where the GPU sat idle in the window: the gaps between its kernels and copies (merged),
    per step, and the long ones (> long_us) by the kernel each came after."""
    spans = sorted(
        (ev.time_range.start, ev.time_range.end, ev.name)
        for ev in prof.events()
        if str(getattr(ev, "device_type", "")) == "DeviceType.CUDA"
    )
    gaps: list[tuple[float, str]] = []
    end, last = None, ""
    for start, stop, name in spans:
        if end is not None and start > end:
            gaps.append((start - end, last))
        if end is None or stop > end:
            end, last = stop, name
    after: dict[str, list[float]] = {}
    for us, name in gaps:
        if us > long_us:
            after.setdefault(name[:80], []).append(us)
    return {
        "idle_ms_per_step": sum(us for us, _ in gaps) / steps / 1e3,
        "gaps_per_step": len(gaps) / steps,
        "long_gaps_per_step": sum(len(v) for v in after.values()) / steps,
        "long_gap_ms_per_step": sum(sum(v) for v in after.values()) / steps / 1e3,
        "long_gaps_after": {
            k: {"n": len(v), "median_us": statistics.median(v)}
            for k, v in sorted(after.items(), key=lambda kv: -sum(kv[1]))[:8]
        },
    }


def add_all(core: EngineCore, args: argparse.Namespace) -> None:
    prompts = random_prompts(args.running, args.input_len, core.info.vocab_size, args.seed)
    sp = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        core.handle(Add(request_id=f"prof-{i}", prompt_token_ids=prompt, sampling=sp), [])


def start_running(core: EngineCore, args: argparse.Namespace) -> dict[str, int]:
    """--running requests added at once and stepped until each has --warm-tokens tokens; the
    tokens each has (one_iteration's counts)."""
    add_all(core, args)
    counts: dict[str, int] = {}
    while len(counts) < args.running or min(counts.values()) < args.warm_tokens:
        one_iteration(core, counts)
    return counts


def one_iteration(core: EngineCore, counts: dict[str, int]) -> int:
    """What the core loop does for one step with work (loop.py _serve): the step, the batch,
    its encoding for the socket. Returns the tokens it emitted."""
    core.step()
    batch = core.batch()
    encode(batch)
    for request_id, ev in batch.events:
        counts[request_id] = counts.get(request_id, 0) + len(ev.token_ids)
    return sum(len(ev.token_ids) for _, ev in batch.events)


def host_rows(profile: cProfile.Profile, steps: int, top: int) -> list[dict[str, Any]]:
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    items = stats.stats.items()  # type: ignore[attr-defined]
    for (path, line, name), (_, calls, tt, ct, _) in sorted(
        items, key=lambda kv: kv[1][2], reverse=True
    )[:top]:
        where = path.split("trtllm_gateway/")[-1] if "trtllm_gateway" in path else path
        rows.append(
            {
                "function": f"{where}:{line}({name})",
                "calls_per_step": calls / steps,
                "self_ms_per_step": tt / steps * 1e3,
                "cum_ms_per_step": ct / steps * 1e3,
            }
        )
    return rows


def profile(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    core = EngineCore(BuiltinConfig(engine_config_from(args)))
    core.load(lambda detail: None)
    settle_heap()  # as a core in its own process does after its load
    t0 = time.perf_counter()
    counts = start_running(core, args)
    report: dict[str, Any] = {"settings": vars(args), "warm_s": time.perf_counter() - t0}
    report["running"] = core.health().running
    cuda = torch.cuda.is_available()
    # First the host alone (cProfile's hooks slow Python down, so it gets its own window),
    # then the wall clock and the GPU's kernels over a window without them.
    prof_host = cProfile.Profile()
    prof_host.enable()
    for _ in range(args.steps):
        one_iteration(core, counts)
    prof_host.disable()
    if cuda:
        torch.cuda.synchronize()
    gpu = (
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) if cuda else None
    )
    periods, cpu, tokens = [], 0.0, 0
    context_before = args.input_len + statistics.fmean(counts.values())
    with gpu if gpu is not None else contextlib.nullcontext():
        for _ in range(args.steps):
            t, c = time.perf_counter(), time.thread_time()
            tokens += one_iteration(core, counts)
            periods.append(time.perf_counter() - t)
            cpu += time.thread_time() - c
        if cuda:
            torch.cuda.synchronize()
    wall = sum(periods)
    report["context_tokens_mean"] = args.input_len + statistics.fmean(counts.values())
    report["host"] = {
        "steps": args.steps,
        "step_period_ms_p50": statistics.median(periods) * 1e3,
        "step_period_ms_mean": wall / args.steps * 1e3,
        "step_periods_ms": [round(p * 1e3, 3) for p in periods],
        "tokens_per_step": tokens / args.steps,
        "output_tok_s": tokens / wall,
        "thread_cpu_share": cpu / wall,
        "functions_by_self_time": host_rows(prof_host, args.steps, args.top),
    }
    if gpu is not None:
        # Each running sequence reads its whole context a step: the timed window's mean.
        context = (context_before + report["context_tokens_mean"]) / 2
        kv_tokens = report["running"] * context
        roof = step_roofline(core.loaded, kv_tokens)
        roof["fraction_of_roofline"] = roof["roofline_ms"] / report["host"]["step_period_ms_p50"]
        report["roofline"] = roof
        report["gpu"] = kernel_table(gpu, args.steps, args.top)
        report["gpu"]["table"] = gpu.key_averages().table(
            sort_by="self_cuda_time_total", row_limit=args.top
        )
    return report


def parser() -> argparse.ArgumentParser:
    p = offline_parser()
    p.description = __doc__
    p.add_argument("--running", type=int, default=256, help="requests started at once")
    p.add_argument("--warm-tokens", type=int, default=32, help="tokens each has before the window")
    p.add_argument("--steps", type=int, default=40, help="steps in the profiled window")
    p.add_argument("--top", type=int, default=25)
    p.set_defaults(input_len=1024, output_len=1024, max_batch_size=256, max_num_tokens=8192)
    return p


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(profile(parser().parse_args()), indent=1, default=str))


if __name__ == "__main__":
    main()

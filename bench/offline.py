"""Offline engine benchmark: the built-in engine driven in process, no HTTP.

Random fixed-length prompts (token ids), ignore_eos, a fixed number of output tokens, and a cap
on requests in flight. Reports output tok/s, TTFT and TPOT; with --decode-latency it also times
batch-1 decode (ms/token) and, on CUDA, the bandwidth roofline from a measured device-to-device
copy. Prints one JSON object last.

--core thread (the default) runs the engine core in a thread of this process, where the
benchmark can reach into it (the roofline, --fit-batch's cap, the core thread's CPU); --core
process runs it in its own process, as `serve` does, so the client's Python (one asyncio task a
request) never holds the GIL the core's step loop needs. In process mode the core's main thread
is sampled from outside, --fit-batch caps the client's concurrency instead of the scheduler's
batch, and --decode-latency (its roofline reads the loaded model) is refused.

  python -m bench.offline --model trtllm_gateway/config/models/llama-3.1-8b.json \\
      --load-format dummy --num-prompts 512 --input-len 1024 --output-len 1024
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import threading
import time
from typing import Any

import psutil

from bench.stats import summarize
from tests.in_thread import thread_core
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core_launch import core_client
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams
from trtllm_gateway.engine.transport.client import CoreClient


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    hi = min(vocab, 32000) - 1  # stay clear of the special ids at the top of most vocabularies
    return [tuple(rng.randint(100, hi) for _ in range(length)) for _ in range(n)]


async def _one(
    engine: CoreClient, request_id: str, prompt: tuple[int, ...], sp: SamplingParams
) -> dict[str, Any]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    req = GenerateRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sp)
    async for ev in engine.generate(req):
        stamps.append(time.perf_counter())
        tokens += len(ev.token_ids)
    ttft = stamps[0] - t0
    tpot = (stamps[-1] - stamps[0]) / (tokens - 1) if tokens > 1 else 0.0
    return {"ttft": ttft, "tpot": tpot, "tokens": tokens, "stamps": stamps}


async def run_load(
    engine: CoreClient,
    prompts: list[tuple[int, ...]],
    output_len: int,
    concurrency: int,
    temperature: float,
) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    sp = SamplingParams(max_tokens=output_len, temperature=temperature, ignore_eos=True)

    async def guarded(i: int, p: tuple[int, ...]) -> dict[str, Any]:
        async with sem:
            return await _one(engine, f"bench-{i}", p, sp)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(guarded(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    out_tokens = sum(r["tokens"] for r in results)
    return {
        "num_prompts": len(prompts),
        "concurrency": concurrency,
        "duration_s": wall,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / wall,
        "total_tok_s": (out_tokens + sum(len(p) for p in prompts)) / wall,
        "ttft_ms": summarize([r["ttft"] * 1e3 for r in results]),
        "tpot_ms": summarize([r["tpot"] * 1e3 for r in results if r["tokens"] > 1]),
    }


async def decode_latency(engine: CoreClient, input_len: int, output_len: int) -> dict[str, Any]:
    """Batch 1: median gap between consecutive tokens of one request (ms/token)."""
    prompt = random_prompts(1, input_len, engine.info.vocab_size, 123)[0]
    sp = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    r = await _one(engine, "latency", prompt, sp)
    gaps = [(b - a) * 1e3 for a, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
    return {
        "input_len": input_len,
        "output_len": output_len,
        "ms_per_token_median": statistics.median(gaps),
        "ms_per_token_mean": statistics.fmean(gaps),
        "context_mean": input_len + output_len / 2,
    }


def _core_tid() -> int | None:
    """The in-thread engine core's OS thread id (tests/in_thread's thread is "engine-core")."""
    return next((t.native_id for t in threading.enumerate() if t.name == "engine-core"), None)


def _core_pid() -> int | None:
    """The engine core's process, a child of this one (--core process)."""
    for child in psutil.Process().children():
        try:
            if any("engine.transport.process" in part for part in child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


def _thread_cpu_s(tid: int | None, pid: int | None = None) -> float:
    """CPU seconds (user + system) the thread has used so far (of process pid, this one by
    default); 0 when it is not found."""
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return 0.0
    for t in threads:
        if t.id == tid:
            return float(t.user_time + t.system_time)
    return 0.0


def roofline(engine: CoreClient, context: float) -> dict[str, Any]:
    """Bytes one batch-1 decode step must read (weights it touches + KV) over copy bandwidth."""
    lm = thread_core(engine).loaded
    assert lm is not None
    return step_roofline(lm, context)


def step_roofline(lm: Any, kv_tokens: float) -> dict[str, Any]:
    """The byte roofline of a decode step over kv_tokens tokens of context in all (a
    LoadedModel's): the weights it reads once plus that KV, over the copy bandwidth measured
    now."""
    import torch

    from bench.device import copy_bandwidth

    model, cfg = lm.model, lm.cfg
    # Parameters, and the weight buffers of FP8 layers (e4m3 weights and their scales).
    weights = [*model.parameters()]
    weights += [b for n, b in model.named_buffers() if n.endswith(("weight", "weight_scale"))]
    weight_bytes = sum(p.numel() * p.element_size() for p in weights)
    if not cfg.tie_word_embeddings:  # an untied embedding table is read one row per token
        weight_bytes -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    kv_bytes = cfg.kv_elems_per_token * lm.backend.kv_caches[0][0].element_size() * kv_tokens
    bw = copy_bandwidth(torch.device("cuda")) if lm.device.type == "cuda" else float("nan")
    return {
        "weight_bytes": weight_bytes,
        "kv_bytes": kv_bytes,
        "copy_bandwidth_GBps": bw / 1e9,
        "roofline_ms": (weight_bytes + kv_bytes) / bw * 1e3,
    }


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    kw: dict[str, Any] = {
        "model": args.model,
        "load_format": args.load_format,
        "device": args.device,
        "dtype": args.dtype,
        "max_batch_size": args.max_batch_size,
        "max_num_tokens": args.max_num_tokens,
        "kv_cache_fraction": args.kv_cache_fraction,
        "cuda_graphs": not args.no_cuda_graphs,
        "enable_prefix_caching": not args.no_prefix_caching,
        "block_size": args.block_size,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    if args.tokenizer:
        kw["tokenizer"] = args.tokenizer
    if args.max_model_len:
        kw["max_model_len"] = args.max_model_len
    if args.num_kv_blocks:
        kw["num_kv_blocks"] = args.num_kv_blocks
    return EngineConfig(**kw)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--concurrency", type=int, nargs="+", default=[0], help="0 = all at once")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-num-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=0)
    p.add_argument("--kv-cache-fraction", type=float, default=0.9)
    p.add_argument("--num-kv-blocks", type=int, default=0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--quantization", default="none", choices=["none", "int8", "fp8"])
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--decode-latency", action="store_true", help="also time batch-1 decode")
    p.add_argument("--latency-output-len", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1, help="warm-up requests before timing")
    p.add_argument("--fit-batch", action="store_true", help="cap running seqs to the KV cache")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--core",
        default="thread",
        choices=["thread", "process"],
        help="the engine core in a thread of this process, or in its own (as served)",
    )
    p.add_argument(
        "--spin-wait",
        action="store_true",
        help="wait for each step's ids spinning (the A/B of sampler.BLOCKING_WAIT)",
    )
    return p


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    config = engine_config_from(args)
    in_thread = args.core == "thread"
    if not in_thread and (args.decode_latency or args.spin_wait):
        raise SystemExit("--decode-latency and --spin-wait need --core thread")
    if args.spin_wait:
        from trtllm_gateway.engine.builtin import sampler

        sampler.BLOCKING_WAIT = False
    engine = core_client(BuiltinConfig(config), in_thread=in_thread)
    t0 = time.perf_counter()
    await engine.start()
    report: dict[str, Any] = {
        "load_s": time.perf_counter() - t0,
        "core": args.core,
        "settings": config.model_dump(
            include={
                "model",
                "load_format",
                "device",
                "dtype",
                "max_batch_size",
                "max_num_tokens",
                "block_size",
                "cuda_graphs",
                "enable_prefix_caching",
                "quantization",
                "kv_cache_dtype",
            }
        ),
    }
    if in_thread:
        lm = thread_core(engine).loaded
        assert lm is not None
        report["dtype"] = str(lm.dtype)
        report["device"] = str(lm.device)
        report["kv_tokens"] = lm.blocks.num_blocks * lm.blocks.block_size
    else:
        report["kv_tokens"] = engine.health().kv_total_blocks * config.block_size
    try:
        vocab = engine.info.vocab_size
        if args.warmup:
            warm = random_prompts(args.warmup, args.input_len, vocab, args.seed + 1)
            await run_load(engine, warm, 8, args.warmup, args.temperature)
        if args.decode_latency:
            lat = await decode_latency(engine, args.input_len, args.latency_output_len)
            lat["roofline"] = roofline(engine, lat["context_mean"])
            lat["fraction_of_roofline"] = (
                lat["roofline"]["roofline_ms"] / lat["ms_per_token_median"]
            )
            report["decode_latency"] = lat
            print(json.dumps({"decode_latency": lat}), flush=True)
        most = 0  # the client's cap on requests in flight (0: none)
        if args.fit_batch:
            # Admit no more sequences than fit at full length: no preemption (recompute) churn.
            fit = report["kv_tokens"] // (args.input_len + args.output_len + config.block_size)
            if in_thread:
                st = thread_core(engine)._st
                st.scheduler.max_batch_size = max(1, min(st.scheduler.max_batch_size, fit))
                report["max_running"] = st.scheduler.max_batch_size
            else:
                most = max(1, min(config.max_batch_size, fit))
                report["max_running"] = most
        pid = None if in_thread else _core_pid()
        runs = []
        for level, conc in enumerate(args.concurrency if args.num_prompts else []):
            # Fresh prompts at each level: the same ones again would be prefix-cache hits (a
            # 1.9M-token e4m3 cache on an H200 kept all 768 of the level before: 2026-11-28).
            seed = args.seed + 100 * level
            prompts = random_prompts(args.num_prompts, args.input_len, vocab, seed)
            c = conc or args.num_prompts
            if most:
                c = min(c, most)
            tid = _core_tid() if in_thread else pid  # a process core steps in its main thread
            cpu0 = _thread_cpu_s(tid, pid)
            hits0 = engine.health().prefix_cache_hits
            r = await run_load(engine, prompts, args.output_len, c, args.temperature)
            r["prefix_cache_hits"] = engine.health().prefix_cache_hits - hits0  # 0: fresh prompts
            # The core thread's share of one CPU over the run (issue 39: below ~70% at 256).
            r["core_thread_cpu_pct"] = (_thread_cpu_s(tid, pid) - cpu0) / r["duration_s"] * 100
            r["input_len"], r["output_len"] = args.input_len, args.output_len
            runs.append(r)
            print(json.dumps({"run": r}), flush=True)
        report["runs"] = runs
        h = engine.health()
        report["preemptions"] = h.preemptions
    finally:
        await engine.stop()
    return report


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parser().parse_args()
    report = asyncio.run(main_async(args))
    print(json.dumps(report))


if __name__ == "__main__":
    main()

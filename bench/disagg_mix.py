"""The mixed load of issue 41 against one or more instances, and its figures.

Long and short prompts at once, each class with its own concurrency cap (lanes), all streamed
through /v1/completions (bench.serve's one_request: random token ids, ignore_eos, usage from the
server). Each class runs in a client process of its own, so one class's chunks never delay the
other's timestamps. With several base URLs, each class alternates over them request by request
(round robin: half of each class on each of two instances).

Figures per class: output tok/s (its output tokens over its own duration), TTFT p50 / p99, ITL
p99 (every gap between chunks, pooled over the class); overall: wall (first request sent to last
token), total output tok/s, and goodput.

Goodput (DistServe's, per request): requests per second of wall time that met both SLOs, a
request meeting them when its TTFT <= ttft_slo and the p99 of its own gaps between tokens <=
itl_slo. Issue 41 sets 2 s and 50 ms.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.serve import make_prompts, one_request
from bench.stats import percentile, summarize


@dataclass(frozen=True)
class MixClass:
    name: str
    input_len: int
    num_prompts: int
    concurrency: int
    seed: int


async def _class_main(
    urls: list[str], cls: MixClass, output_len: int, start_at: float
) -> list[dict[str, Any]]:
    prompts = make_prompts(cls.num_prompts, cls.input_len, 32000, cls.seed, None)
    turn = itertools.count()
    limits = httpx.Limits(max_connections=cls.concurrency + 4)
    timeout = httpx.Timeout(None, connect=30.0)
    clients = [httpx.AsyncClient(base_url=u, limits=limits, timeout=timeout) for u in urls]
    results: list[dict[str, Any]] = []
    model = (await clients[0].get("/v1/models")).json()["data"][0]["id"]

    async def lane() -> None:
        while (i := next(turn)) < len(prompts):
            body = {
                "model": model,
                "prompt": prompts[i],
                "max_tokens": output_len,
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
                "temperature": 0.0,
            }
            r = await one_request(clients[i % len(clients)], body, "/v1/completions")
            r["instance"] = i % len(clients)
            results.append(r)

    await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
    try:
        await asyncio.gather(*(lane() for _ in range(cls.concurrency)))
    finally:
        for c in clients:
            await c.aclose()
    return results


def _class_process(
    urls: list[str], cls: MixClass, output_len: int, ready: threading.Barrier, out: mp.Queue[Any]
) -> None:
    ready.wait()  # every class starts when the last process is up (bench/serve.py _spawned)
    start_at = time.perf_counter()
    out.put((cls.name, asyncio.run(_class_main(urls, cls, output_len, start_at))))


def run_mix(
    urls: list[str], classes: list[MixClass], output_len: int
) -> dict[str, list[dict[str, Any]]]:
    """Every class at once, one client process each; per-request records by class."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ready = ctx.Barrier(len(classes))
    procs = [
        ctx.Process(target=_class_process, args=(urls, c, output_len, ready, out)) for c in classes
    ]
    for proc in procs:
        proc.start()
    results = dict(out.get() for _ in procs)
    for proc in procs:
        proc.join()
    return results


def meets_slo(r: dict[str, Any], ttft_slo_s: float, itl_slo_s: float) -> bool:
    itl_p99 = percentile(r["itl"], 99) if r["itl"] else 0.0
    return bool(r["ok"]) and r["ttft"] <= ttft_slo_s and itl_p99 <= itl_slo_s


def figures(
    results: dict[str, list[dict[str, Any]]], ttft_slo_s: float = 2.0, itl_slo_s: float = 0.05
) -> dict[str, Any]:
    """Per class and overall, as the module docstring defines them."""
    everything = [r for rs in results.values() for r in rs]
    ok = [r for r in everything if r["ok"]]
    report: dict[str, Any] = {"classes": {}}
    for name, rs in results.items():
        good = [r for r in rs if r["ok"]]
        span = (max(r["end"] for r in good) - min(r["start"] for r in good)) if good else 0.0
        out_tokens = sum(r["output_tokens"] for r in good)
        report["classes"][name] = {
            "completed": len(good),
            "failed": len(rs) - len(good),
            "errors": sorted({r.get("error", "") for r in rs if not r["ok"]})[:3],
            "output_tok_s": out_tokens / span if span else float("nan"),
            "ttft_ms": summarize([r["ttft"] * 1e3 for r in good]),
            "itl_ms": summarize([x * 1e3 for r in good for x in r["itl"]]),
            "met_slo": sum(meets_slo(r, ttft_slo_s, itl_slo_s) for r in rs),
        }
    wall = (max(r["end"] for r in ok) - min(r["start"] for r in ok)) if ok else float("nan")
    met = sum(meets_slo(r, ttft_slo_s, itl_slo_s) for r in everything)
    report.update(
        wall_s=wall,
        output_tok_s=sum(r["output_tokens"] for r in ok) / wall if ok else float("nan"),
        requests=len(everything),
        met_slo=met,
        goodput_req_s=met / wall if ok else float("nan"),
        slo={"ttft_s": ttft_slo_s, "itl_p99_s": itl_slo_s},
    )
    return report

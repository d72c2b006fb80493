"""Serving benchmark over the OpenAI HTTP API only (aiohttp, streaming), vLLM `bench serve` metrics.

Random fixed-length prompts (token ids sent as the `prompt` list on /v1/completions, or decoded
to text with --prompt-format text), ignore_eos, max_tokens, a concurrency cap and a request rate
(Poisson, or gamma with --burstiness). Output tokens come from the server's usage report.
Metrics, as vLLM defines them: output tok/s = sum of output tokens / duration; TTFT per request;
TPOT = (latency - TTFT) / (output tokens - 1); ITL = every gap between streamed chunks, pooled;
E2EL. Several client processes (--workers) keep the client from being the bottleneck.

  python -m bench.serve --base-url http://127.0.0.1:8000 --num-prompts 512 \\
      --input-len 1024 --output-len 1024 --max-concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import multiprocessing as mp
import pickle
import queue
import random
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import aiohttp
import httpx

from bench.stats import summarize


def arrivals(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Start offsets in seconds: all at 0 for an infinite rate, else gamma (Poisson at 1.0)."""
    if rate == float("inf"):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, theta)
    return out


def make_prompts(
    n: int, length: int, vocab: int, seed: int, tokenizer: str | None
) -> list[list[int] | str]:
    rng = random.Random(seed)
    hi = min(vocab, 32000) - 1
    ids = [[rng.randint(100, hi) for _ in range(length)] for _ in range(n)]
    if tokenizer is None:
        return list(ids)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{tokenizer}/tokenizer.json")
    return [tok.decode(x) for x in ids]


class _Reading:
    """One streamed response read a line at a time: TTFT, the gaps between chunks, usage."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = {"ok": False, "ttft": 0.0, "itl": [], "output_tokens": 0}
        self.st = self.last = time.perf_counter()

    def line(self, line: str | bytes) -> bool:
        """Take one line of the event stream; True when the stream is over ([DONE], an error)."""
        if isinstance(line, bytes):
            line = line.decode()
        if not line.startswith("data:"):
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            self.out["closed"] = time.perf_counter()
            return True
        chunk = json.loads(data)
        now = time.perf_counter()
        out = self.out
        if chunk.get("choices"):
            if out["ttft"] == 0.0:
                out["ttft"] = now - self.st
            else:
                out["itl"].append(now - self.last)
            self.last = now
        if chunk.get("usage"):
            out["output_tokens"] = chunk["usage"]["completion_tokens"]
            out["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
        if chunk.get("error"):
            out["error"] = str(chunk["error"])[:200]
            return True
        return False

    def done(self) -> dict[str, Any]:
        out = self.out
        if "error" not in out:
            out["latency"] = self.last - self.st
            out["start"], out["end"] = self.st, self.last
            out["ok"] = True
        return out


async def one_request(
    client: httpx.AsyncClient, body: dict[str, Any], endpoint: str
) -> dict[str, Any]:
    r = _Reading()
    try:
        async with client.stream("POST", endpoint, json=body) as resp:
            if resp.status_code != 200:
                r.out["error"] = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return r.out
            async for line in resp.aiter_lines():
                if r.line(line):
                    break
    except (httpx.HTTPError, ValueError) as e:
        r.out["error"] = repr(e)[:200]
    return r.done()


async def one_request_aiohttp(
    session: aiohttp.ClientSession, body: dict[str, Any], endpoint: str
) -> dict[str, Any]:
    """one_request over aiohttp, the client of vLLM's benchmark_serving and of AIPerf: it reads a
    stream for about half httpx's CPU, which on a host the server shares is the server's."""
    r = _Reading()
    try:
        async with session.post(endpoint, json=body) as resp:
            if resp.status != 200:
                r.out["error"] = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return r.out
            async for line in resp.content:
                if r.line(line):
                    break
    except (aiohttp.ClientError, ValueError) as e:
        r.out["error"] = repr(e)[:200]
    return r.done()


async def worker_main(job: dict[str, Any], claim: Callable[[], int]) -> list[dict[str, Any]]:
    """`concurrency` lanes, each sending the next unclaimed request once its arrival time has
    come. Indices are claimed from one counter shared by every client process, so the cap is
    global: a slot freed in any process takes the next request (a static share per process
    would leave some processes' last requests for a late wave when the engine runs fewer than
    the cap, which an in-process run with one semaphore does not have)."""
    start_at, requests = job["start_at"], job["requests"]
    results: list[dict[str, Any]] = []
    send: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

    async def lanes() -> None:
        async def lane() -> None:
            while (i := claim()) < len(requests):
                offset, body = requests[i]
                delay = start_at + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                results.append(await send(body))

        await asyncio.gather(*(lane() for _ in range(job["concurrency"])))

    endpoint = job["endpoint"]
    if job.get("client", "aiohttp") == "aiohttp":
        connector = aiohttp.TCPConnector(limit=job["concurrency"] + 4)
        timeout = aiohttp.ClientTimeout(total=None, connect=30.0)
        async with aiohttp.ClientSession(
            job["base_url"], connector=connector, timeout=timeout, read_bufsize=1 << 20
        ) as session:
            send = functools.partial(one_request_aiohttp, session, endpoint=endpoint)
            await lanes()
        return results
    limits = httpx.Limits(max_connections=job["concurrency"] + 4)
    with_timeout = httpx.Timeout(None, connect=30.0)
    async with httpx.AsyncClient(
        base_url=job["base_url"], limits=limits, timeout=with_timeout
    ) as c:
        send = functools.partial(one_request, c, endpoint=endpoint)
        await lanes()
    return results


def _worker(job: dict[str, Any]) -> list[dict[str, Any]]:
    return asyncio.run(worker_main(job, itertools.count().__next__))


def _claim_from(counter: Synchronized[int]) -> Callable[[], int]:
    def claim() -> int:
        with counter.get_lock():
            counter.value += 1
            return counter.value - 1

    return claim


def _worker_process(
    job: dict[str, Any],
    counter: Synchronized[int],
    out: mp.Queue[Any],
    ready: threading.Barrier,
) -> None:
    """One client process: its requests from the file the parent wrote (a process object a
    pipe's buffer holds, so the parent's start() of the next process does not wait for this one
    to come up), then the barrier, so that every process's lanes start together."""
    with open(job.pop("requests_file"), "rb") as f:
        job["requests"] = pickle.load(f)
    ready.wait()
    job["start_at"] = time.perf_counter()
    out.put(asyncio.run(worker_main(job, _claim_from(counter))))


def request_body(args: argparse.Namespace, model: str, prompt: list[int] | str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": args.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": args.temperature,
    }
    if args.endpoint == "chat":
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = prompt
    return body


def prefix_cache_hits(base: str) -> float | None:
    """The gateway's prompt tokens found in its prefix cache so far (its /metrics), or None for
    a server without that counter (llama.cpp)."""
    try:
        text = httpx.get(f"{base}/metrics", timeout=30).text
    except httpx.HTTPError:
        return None
    name = "trtllm_gateway:prefix_cache_hits_total"
    values = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name)]
    return sum(values) if values else None


def wait_ready(base: str, timeout: float) -> None:
    """Poll /health until the server answers 200 (the engine has loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base} not ready after {timeout:.0f}s")
        time.sleep(0.5)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    base = args.base_url.rstrip("/")
    wait_ready(base, args.ready_timeout)
    info = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]
    model = args.model or info["id"]
    vocab = args.vocab_size
    tokenizer = args.tokenizer if args.prompt_format == "text" else None
    endpoint = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    if args.warmup:
        warm = make_prompts(args.warmup, args.input_len, vocab, args.seed + 1, tokenizer)
        job = {
            "base_url": base,
            "endpoint": endpoint,
            "client": args.client,
            "concurrency": args.warmup,
            "start_at": time.perf_counter(),
            "requests": [(0.0, {**request_body(args, model, p), "max_tokens": 4}) for p in warm],
        }
        _worker(job)
    prompts = make_prompts(args.num_prompts, args.input_len, vocab, args.seed, tokenizer)
    offsets = arrivals(args.num_prompts, args.request_rate, args.burstiness, args.seed)
    conc = args.max_concurrency or args.num_prompts
    workers = max(1, min(args.workers, conc))
    requests = [(offsets[i], request_body(args, model, prompts[i])) for i in range(len(prompts))]
    jobs = [
        {
            "base_url": base,
            "endpoint": endpoint,
            "client": args.client,
            "concurrency": len(range(w, conc, workers)),
        }
        for w in range(workers)
    ]
    if workers == 1:
        results = _worker({**jobs[0], "start_at": time.perf_counter(), "requests": requests})
    else:
        results = _spawned(jobs, requests)
    return metrics(results, args)


def _spawned(jobs: list[dict[str, Any]], requests: list[Any]) -> list[dict[str, Any]]:
    """The jobs in client processes whose lanes all start at once. Until 2026-11-29 each
    process got the requests in its arguments and a start time 3 s ahead: the parent's start()
    waited for each spawned process to come up and read its ~5 MB, one after another, so a
    16-process run's lanes came up over ~8 s (the engine ran 80 -> 256 requests over its first
    8 s of 15), counted in its duration."""
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    out = ctx.Queue()
    ready = ctx.Barrier(len(jobs))
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/requests.pickle"
        with open(path, "wb") as f:
            pickle.dump(requests, f, protocol=pickle.HIGHEST_PROTOCOL)
        procs = [
            ctx.Process(
                target=_worker_process, args=({**j, "requests_file": path}, counter, out, ready)
            )
            for j in jobs
        ]
        for proc in procs:
            proc.start()
        try:
            results = _collect(procs, out)
        except BaseException:
            for proc in procs:  # the others wait at the barrier, or are mid-run
                proc.terminate()
            raise
        finally:
            for proc in procs:
                proc.join()
    return results


def _collect(procs: list[Any], out: mp.Queue[Any]) -> list[dict[str, Any]]:
    """Every process's results; RuntimeError once a process has died without giving them
    (the others would wait at the barrier, or this on the queue, for ever)."""
    results: list[dict[str, Any]] = []
    left = len(procs)
    while left:
        try:
            results += out.get(timeout=1.0)
            left -= 1
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a client process exited with status {dead[0]}") from None
    return results


def steady(ok: list[dict[str, Any]], concurrency: int) -> dict[str, float] | None:
    """Chunks a second while every lane is busy: from when the first `concurrency` requests all
    have their first token to when the last request starts (after it, lanes only finish). A
    run's start (its prompts' prefills) and drain (its last requests ending one by one, up to a
    request's lifetime) are left out, which a short run's output_throughput is dominated by
    (a 1,024-request run at 256 is four requests a lane). None when the window is empty."""
    if len(ok) <= concurrency:
        return None
    by_start = sorted(ok, key=lambda r: r["start"])
    t0 = max(r["start"] + r["ttft"] for r in by_start[:concurrency])
    t1 = by_start[-1]["start"]
    if t1 <= t0:
        return None
    chunks = 0
    for r in ok:
        t = r["start"] + r["ttft"]
        chunks += t0 <= t <= t1
        for gap in r["itl"]:
            t += gap
            chunks += t0 <= t <= t1
    return {
        "window_s": t1 - t0,
        "from_s": t0 - by_start[0]["start"],
        "chunk_throughput": chunks / (t1 - t0),
    }


def ramp(ok: list[dict[str, Any]], concurrency: int) -> float:
    """Seconds from the first request's start to the start of the concurrency-th: how long the
    client took to open every lane (near 0 with an unlimited rate)."""
    starts = sorted(r["start"] for r in ok)[:concurrency]
    return starts[-1] - starts[0] if starts else 0.0


def metrics(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    duration = max(r["end"] for r in ok) - min(r["start"] for r in ok) if ok else float("nan")
    out_tokens = sum(r["output_tokens"] for r in ok)
    in_tokens = sum(r.get("prompt_tokens", 0) for r in ok)
    tpots = [
        (r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1
    ]
    itl = [x for r in ok for x in r["itl"]]
    # The lanes' requests side by side: how many were open on average (of the concurrency
    # cap), and how long a stream stayed open after its last token ([DONE]).
    open_s = sum(r.get("closed", r["end"]) - r["start"] for r in ok)
    close = [(r["closed"] - r["end"]) * 1e3 for r in ok if "closed" in r]
    chunks = len(itl) + len(ok)  # streamed chunks with choices: the first of each, then one per gap
    ms = 1e3
    return {
        "endpoint": args.endpoint,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate,
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({r.get("error", "") for r in failed})[:5],
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "chunks": chunks,
        "chunk_throughput": chunks / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": summarize([r["ttft"] * ms for r in ok]),
        "tpot_ms": summarize([t * ms for t in tpots]),
        "itl_ms": summarize([x * ms for x in itl]),
        "e2el_ms": summarize([r["latency"] * ms for r in ok]),
        "open_requests_mean": open_s / duration,
        "ramp_s": ramp(ok, args.max_concurrency or args.num_prompts),
        "close_ms": summarize(close),
        "steady": steady(ok, args.max_concurrency or args.num_prompts),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-concurrency", type=int, default=0, help="0 = no cap")
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--prompt-format", choices=["ids", "text"], default="ids")
    p.add_argument("--tokenizer", default=None, help="directory with tokenizer.json (text)")
    p.add_argument("--vocab-size", type=int, default=32000, help="random ids are below this")
    p.add_argument("--workers", type=int, default=1, help="client processes")
    p.add_argument(
        "--client",
        choices=["aiohttp", "httpx"],
        default="aiohttp",
        help="the HTTP client reading the streams (aiohttp: vLLM's benchmark_serving's; httpx: "
        "this benchmark's before 2026-11-29, 1.6-2.1x aiohttp's CPU a chunk on a 2-core Xeon VM)",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ready-timeout", type=float, default=600.0, help="wait for /health")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.endpoint == "chat" and args.prompt_format == "ids":
        args.prompt_format = "text"
    print(json.dumps(run_benchmark(args)))


if __name__ == "__main__":
    main()

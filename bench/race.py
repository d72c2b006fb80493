"""Interleaved rounds between servers on one machine, the idle ones frozen: bench.run's race.

```
start every server (each its own environment)  ->  freeze all (SIGSTOP, whole process tree)
for each round, for each concurrency:
    for each server (order rotating by round):  thaw -> bench.serve -> freeze
pairwise ratios per (round, concurrency) -> their median and spread
```

Both servers stay loaded for the whole run, but only the one being measured can run: a frozen
process tree (the gateway's API server and its engine core, llama.cpp's server) takes no CPU, so
an idle llama.cpp server's polling threads or the gateway's OpenMP threads cannot slow the other.
Each measurement records the 1-minute load before and after and the run-queue wait of the
measured server's threads (run_queue.py's schedstat, summed over its process tree: CPU-seconds a
second spent runnable but not running; ~0 when the server had the cores to itself).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from bench.serve import parser as serve_parser
from bench.serve import prefix_cache_hits, run_benchmark
from trtllm_gateway.engine.builtin.run_queue import waited_ns


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


@dataclass
class Server:
    """One server process (tree): started with its own command and environment."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    port: int
    cwd: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=self.cwd)

    def pids(self) -> list[int]:
        """The server and every process under it (the gateway's engine core leads its own
        process group, so a group signal would miss it)."""
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            return [root.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def signal(self, sig: signal.Signals) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def waited_ns(self) -> int:
        return sum(waited_ns(Path(f"/proc/{pid}/task")) or 0 for pid in self.pids())

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.thaw()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


def wait_ready(server: Server, timeout: float = 900.0) -> None:
    """Poll /health until 200 (a first start may build the CPU kernels: minutes)."""
    import httpx

    assert server.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode} at start")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{server.name} not ready after {timeout:.0f} s")


def serve_args(args: argparse.Namespace, port: int, conc: int, rnd: int) -> argparse.Namespace:
    """bench.serve's arguments for one measurement: the same prompts for every server, new
    ones for each round and each concurrency (both servers cache prefixes: a prompt seen in an
    earlier measurement would measure a cache hit; until 2026-11-28 the concurrencies of a round
    shared one seed, so a later one's first prompts were the earlier one's; seeds 100 apart, as
    bench.serve's warmup takes seed + 1)."""
    n = max(args.min_prompts, 2 * conc)
    seed = 1000 * rnd + 100 * args.concurrency.index(conc)
    return serve_parser().parse_args(
        [
            *("--base-url", f"http://127.0.0.1:{port}", "--num-prompts", str(n)),
            *("--seed", str(seed)),
            *("--input-len", str(args.input_len), "--output-len", str(args.output_len)),
            *("--max-concurrency", str(conc), "--vocab-size", "49152", "--warmup", "2"),
        ]
    )


def measure(server: Server, args: argparse.Namespace, conc: int, rnd: int) -> dict[str, Any]:
    server.thaw()
    try:
        url = f"http://127.0.0.1:{server.port}"
        before, w0, t0, hits = load(), server.waited_ns(), time.monotonic(), prefix_cache_hits(url)
        r = run_benchmark(serve_args(args, server.port, conc, rnd))
        wall = time.monotonic() - t0
        if hits is not None:  # the gateway's: 0 when every prompt is new to it
            r["prefix_cache_hit_tokens"] = (prefix_cache_hits(url) or 0.0) - hits
        r["wait_share"] = round((server.waited_ns() - w0) / 1e9 / wall, 2)
        r["load_before"], r["load_after"] = before, load()
    finally:
        server.freeze()
    if r["failed"]:
        raise RuntimeError(f"{server.name}: {r['failed']} requests failed: {r['errors']}")
    return r


def idle_cpu(server: Server, seconds: float) -> float:
    """Percent of one core the server's process tree used over `seconds` with no requests."""

    def used() -> float:
        total = 0.0
        for pid in server.pids():
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
        return total

    server.thaw()
    try:
        c0, t0 = used(), time.monotonic()
        time.sleep(seconds)
        return round(100 * (used() - c0) / (time.monotonic() - t0), 2)
    finally:
        server.freeze()


def race(servers: list[Server], args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every server's runs: one per (round, concurrency), tagged with both."""
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    try:
        for s in servers:
            s.start()
        for s in servers:
            wait_ready(s)
            s.freeze()
        for rnd in range(args.rounds):
            for conc in args.concurrency:
                k = rnd % len(servers)
                for s in servers[k:] + servers[:k]:
                    r = measure(s, args, conc, rnd) | {"round": rnd, "server": s.name}
                    runs[s.name].append(r)
                    print(
                        f"round {rnd} c={conc} {s.name}: {r['output_throughput']:.1f} tok/s, "
                        f"TTFT p50 {r['ttft_ms']['p50']:.0f} ms, ITL p50 {r['itl_ms']['p50']:.1f}"
                        f" ms, load {r['load_before']}, run-queue wait {r['wait_share']}",
                        flush=True,
                    )
        if args.idle_s > 0:  # right after its last requests: a spinning tail counts
            for s in servers:
                pct = idle_cpu(s, args.idle_s)
                runs[s.name].append({"idle_cpu_pct": pct, "idle_s": args.idle_s})
                print(f"{s.name} idle for {args.idle_s:g} s: {pct}% of a core", flush=True)
    finally:
        for s in servers:
            s.stop()
    return runs


def summarize(runs: list[dict[str, Any]], conc: int) -> dict[str, Any]:
    """Medians over the rounds at one concurrency."""
    rs = [r for r in runs if r.get("max_concurrency") == conc]
    med = statistics.median
    return {
        "rounds": len(rs),
        "tok_s": med(r["output_throughput"] for r in rs),
        "tok_s_all": [round(r["output_throughput"], 1) for r in rs],
        "ttft_p50": med(r["ttft_ms"]["p50"] for r in rs),
        "itl_p50": med(r["itl_ms"]["p50"] for r in rs),
        "wait": [r["wait_share"] for r in rs],
        "load": [r["load_before"].split()[0] for r in rs],
    }


def ratios(ours: list[dict[str, Any]], peer: list[dict[str, Any]], conc: int) -> list[float]:
    """Our tok/s over the peer's, one per round (the two measured back to back)."""
    by_round = {r["round"]: r for r in peer if r.get("max_concurrency") == conc}
    return [
        r["output_throughput"] / by_round[r["round"]]["output_throughput"]
        for r in ours
        if r.get("max_concurrency") == conc and r["round"] in by_round
    ]

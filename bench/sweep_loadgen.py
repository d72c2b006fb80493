"""One sweep point through a load generator: bench.serve (built in) or AIPerf, same result keys.

Both give a flat record: output tok/s, request/s, TTFT / ITL / E2E latency (mean, p50, p99, ms)
and the per-user rate (1000 / mean ITL: the decode speed one client sees). AIPerf runs as a
subprocess (`aiperf profile ... --artifact-dir DIR`) and its `profile_export_aiperf.json` is read.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx

from bench.serve import parser as serve_parser
from bench.serve import run_benchmark

LOADGENS = ("builtin", "aiperf")


def aiperf_available() -> bool:
    return shutil.which("aiperf") is not None


def _per_user(itl_ms: float) -> float:
    return 1e3 / itl_ms if itl_ms and itl_ms == itl_ms else float("nan")


def run_builtin(
    url: str,
    concurrency: int,
    isl: int,
    osl: int,
    requests: int,
    warmup: int,
    vocab: int,
    workers: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """One point; seed: its prompts' (a point after another on the same server needs prompts
    of its own, or it measures prefix-cache hits)."""
    args = serve_parser().parse_args(
        [
            "--base-url", url, "--num-prompts", str(requests), "--input-len", str(isl),
            "--output-len", str(osl), "--max-concurrency", str(concurrency),
            "--warmup", str(warmup), "--vocab-size", str(vocab), "--workers", str(workers),
            "--seed", str(seed),
        ]
    )  # fmt: skip
    r = run_benchmark(args)
    return {
        "completed": r["completed"],
        "failed": r["failed"],
        "errors": r["errors"],
        "duration_s": r["duration_s"],
        "request_throughput": r["request_throughput"],
        "output_throughput": r["output_throughput"],
        "ttft_ms_mean": r["ttft_ms"]["mean"],
        "ttft_ms_p50": r["ttft_ms"]["p50"],
        "ttft_ms_p99": r["ttft_ms"]["p99"],
        "itl_ms_mean": r["itl_ms"]["mean"],
        "itl_ms_p50": r["itl_ms"]["p50"],
        "itl_ms_p99": r["itl_ms"]["p99"],
        "e2el_ms_mean": r["e2el_ms"]["mean"],
        "tok_s_per_user": _per_user(r["tpot_ms"]["mean"]),
    }


def aiperf_command(
    url: str,
    model: str,
    concurrency: int,
    isl: int,
    osl: int,
    requests: int,
    out: Path,
    tokenizer: str | None = None,
) -> list[str]:
    """`aiperf profile` for one point (option names of AIPerf 0.13)."""
    cmd = [
        "aiperf", "profile", "--model", model, "--url", url, "--endpoint-type", "completions",
        "--streaming", "--concurrency", str(concurrency), "--request-count", str(requests),
        "--isl", str(isl), "--isl-stddev", "0", "--output-tokens-mean", str(osl),
        "--osl-stddev", "0", "--extra-inputs", "ignore_eos:true", "--ui", "none",
        "--artifact-dir", str(out),
    ]  # fmt: skip
    return [*cmd, "--tokenizer", tokenizer] if tokenizer else cmd


def _stat(doc: dict[str, Any], key: str, stat: str) -> float:
    value = (doc.get(key) or {}).get(stat)
    return float(value) if isinstance(value, int | float) else float("nan")


def read_aiperf(doc: dict[str, Any]) -> dict[str, Any]:
    """Map AIPerf's aggregated export (metric -> {unit, avg, p50, p99, ...}) onto our keys."""
    errors = doc.get("error_summary") or []
    failed = sum(int(e.get("count", 0)) for e in errors)
    itl = _stat(doc, "inter_token_latency", "avg")
    return {
        "completed": int(_stat(doc, "request_count", "avg")),
        "failed": failed,
        "errors": [str((e.get("error_details") or {}).get("message", ""))[:200] for e in errors],
        "duration_s": _stat(doc, "benchmark_duration", "avg"),
        "request_throughput": _stat(doc, "request_throughput", "avg"),
        "output_throughput": _stat(doc, "output_token_throughput", "avg"),
        "ttft_ms_mean": _stat(doc, "time_to_first_token", "avg"),
        "ttft_ms_p50": _stat(doc, "time_to_first_token", "p50"),
        "ttft_ms_p99": _stat(doc, "time_to_first_token", "p99"),
        "itl_ms_mean": itl,
        "itl_ms_p50": _stat(doc, "inter_token_latency", "p50"),
        "itl_ms_p99": _stat(doc, "inter_token_latency", "p99"),
        "e2el_ms_mean": _stat(doc, "request_latency", "avg"),
        "tok_s_per_user": _per_user(itl),
    }


def run_aiperf(
    url: str,
    concurrency: int,
    isl: int,
    osl: int,
    requests: int,
    out: Path,
    tokenizer: str | None = None,
) -> dict[str, Any]:
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    out.mkdir(parents=True, exist_ok=True)
    cmd = aiperf_command(url, model, concurrency, isl, osl, requests, out, tokenizer)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    exports = sorted(out.rglob("profile_export_aiperf.json"))
    if not exports:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {out}")
    return read_aiperf(json.loads(exports[-1].read_text()))

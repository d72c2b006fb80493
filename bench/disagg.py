"""Aggregated vs prefill+decode on mixed long/short prompts: TTFT and ITL per prompt class.

Starts the servers itself (built-in engine, real default model unless --serve-args says
otherwise), runs long and short prompts at the same time through bench.serve (OpenAI API only),
and reads the KV transfer cost per prompt token from the decode instance's /metrics.

    python -m bench.disagg --long-len 1024 --short-len 64 --num-prompts 16 --output-len 64
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.serve import parser as serve_parser
from bench.serve import run_benchmark, wait_ready

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    cmd = [sys.executable, "-m", "trtllm_gateway", "serve", "--port", str(port), *args]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=f)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, 600)
    return proc, url


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pat = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.M)
    return sum(float(m.group(2)) for m in pat.finditer(text))


def _mixed(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Long and short prompts at once, each class with its own concurrency share."""
    results: dict[str, Any] = {}

    def run(name: str, input_len: int, seed: int) -> None:
        ns = serve_parser().parse_args(
            [
                "--base-url", url, "--num-prompts", str(args.num_prompts),
                "--input-len", str(input_len), "--output-len", str(args.output_len),
                "--max-concurrency", str(args.concurrency), "--seed", str(seed),
                "--warmup", "0",
            ]
        )  # fmt: skip
        results[name] = run_benchmark(ns)

    threads = [
        threading.Thread(target=run, args=("long", args.long_len, 1)),
        threading.Thread(target=run, args=("short", args.short_len, 2)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--long-len", type=int, default=1024)
    p.add_argument("--short-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=16, help="per class")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4, help="per class")
    p.add_argument("--serve-args", default="--num-kv-blocks 2048", help="extra serve flags")
    p.add_argument("--log-dir", default="/tmp")
    p.add_argument("--out", default=None, help="write the JSON result here")
    args = p.parse_args(argv)
    extra = args.serve_args.split()
    logs = Path(args.log_dir)
    report: dict[str, Any] = {"args": vars(args)}

    proc, url = _start(extra, logs / "bench-agg.log")
    try:
        report["aggregated"] = _mixed(url, args)
    finally:
        _stop(proc)

    pre, pre_url = _start(["--mode", "prefill", *extra], logs / "bench-prefill.log")
    dec_args = ["--mode", "decode", "--prefill-url", pre_url, "--max-local-prefill-tokens", "256"]
    dec, dec_url = _start([*dec_args, *extra], logs / "bench-decode.log")
    try:
        report["disaggregated"] = _mixed(dec_url, args)
        kv_bytes = _metric(dec_url, "trtllm_gateway:kv_transfer_bytes_total")
        kv_s = _metric(dec_url, "trtllm_gateway:kv_transfer_seconds_sum")
        remote = sum(
            float(m.group(1))
            for m in re.finditer(
                r'remote_prefill_total\{[^}]*outcome="remote"[^}]*\} ([0-9.eE+-]+)',
                httpx.get(f"{dec_url}/metrics", timeout=10).text,
            )
        )
        tokens = remote * args.long_len
        report["kv_transfer"] = {
            "remote_prefills": remote,
            "bytes_total": kv_bytes,
            "seconds_total": kv_s,
            "bytes_per_prompt_token": kv_bytes / tokens if tokens else float("nan"),
            "us_per_prompt_token": 1e6 * kv_s / tokens if tokens else float("nan"),
        }
    finally:
        _stop(dec)
        _stop(pre)
    report["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

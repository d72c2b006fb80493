"""Issue 41's comparison: prefill + decode against what a user would run instead on the same GPUs.

Three setups, each on fresh servers it starts itself, the same mixed load (bench/disagg_mix.py:
long and short prompts at once, a concurrency cap per class, streamed):

    agg    one aggregated instance on the first GPU alone
    pd     --mode prefill on the first GPU + --mode decode --prefill-url on the second
    agg2   two aggregated instances, one per GPU, each class round robin over them

Per setup: long output tok/s, TTFT p50 / p99 and ITL p99 per class, wall, total output tok/s,
goodput (requests/s meeting TTFT <= 2 s and their own ITL p99 <= 50 ms, bench/disagg_mix.py),
and for pd the decode instance's prefill path counters (remote, remote_retried, local_busy, ...),
busy answers, lease renewals, sibling health and KV moved, as deltas over the mix.

    python -m bench.disagg --preset gpu-8b --out /tmp/disagg.json    # 2 GPUs, 8B shape, dummy
    python -m bench.disagg --preset cpu                              # here: 135M on the CPU

The GPU preset is the issue's run (Llama-3.1-8B shape, random weights, --max-batch-size 64
--max-model-len 4096; 48 + 48 prompts of 2,048 and 64 tokens, 12 at a time per class, 128 output
tokens); bench/gpu_call.sh's `disagg` step runs it on a 2-GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.disagg_mix import MixClass, figures, run_mix
from bench.serve import wait_ready
from trtllm_gateway.engine.stats import OUTCOMES

ROOT = Path(__file__).resolve().parents[1]
PRESETS: dict[str, dict[str, Any]] = {
    "gpu-8b": {
        "serve_args": "--model trtllm_gateway/config/models/llama-3.1-8b.json --load-format dummy "
        "--max-batch-size 64 --max-model-len 4096 --log-level info",  # info: the cores' hand-off
        # cost by call when they stop (kv_handoffs.HandoffClock.summary) is in --log-dir
        "long_len": 2048,
        "short_len": 64,
        "num_prompts": 48,
        "concurrency": 12,
        "output_len": 128,
        "gpus": "0,1",
    },
    "cpu": {  # the default model (SmolLM2-135M, real weights) and counts a 2-core CPU runs
        "serve_args": "--num-kv-blocks 2048 --log-level warning",
        "long_len": 512,
        "short_len": 32,
        "num_prompts": 6,
        "concurrency": 2,
        "output_len": 32,
        "gpus": "",
    },
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Instance:
    """One `serve` process on a GPU of its own, its log in log_dir. The GPU is the only one it
    sees (CUDA_VISIBLE_DEVICES), or with see_all it sees every GPU and serves on `--device
    cuda:N`: a prefill/decode pair must, for CUDA IPC names a GPU by its index
    (docs/disaggregation.md, "Two GPUs of one host")."""

    def __init__(
        self, name: str, args: list[str], gpu: str, log_dir: Path, see_all: bool = False
    ) -> None:
        self.name = name
        port = _port()
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        if gpu and see_all:
            args = [*args, "--device", f"cuda:{gpu}"]
        elif gpu:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        cmd = [sys.executable, "-m", "trtllm_gateway", "serve", "--port", str(port), *args]
        self.log = log_dir / f"disagg-{name}.log"
        with self.log.open("wb") as f:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=f, env=env)

    def ready(self, timeout: float = 900.0) -> Instance:
        try:
            wait_ready(self.url, timeout)
        except Exception:
            self.stop()
            raise RuntimeError(f"{self.name} did not start; see {self.log}") from None
        return self

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics by its name and labels."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for m in re.finditer(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) ([0-9.eE+-]+|NaN)$", text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def _sum(samples: dict[str, float], name: str, label: str = "") -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and label in k)


def path_counters(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The decode instance's prefill paths and KV moved during the mix (deltas)."""
    p = "trtllm_gateway:"

    def delta(name: str, label: str = "") -> float:
        return _sum(after, p + name, label) - _sum(before, p + name, label)

    return {
        "paths": {o: delta("remote_prefill_total", f'outcome="{o}"') for o in OUTCOMES},
        "busy_answers": delta("remote_prefill_busy_total"),
        "lease_renewals": delta("kv_lease_renewals_total"),
        "siblings_unhealthy_at_end": sum(
            1 for k, v in after.items() if k.startswith(p + "sibling_healthy") and v == 0.0
        ),
        "kv_bytes": delta("kv_transfer_bytes_total"),
        "kv_seconds": delta("kv_transfer_seconds_sum"),
        **handoff_cost(before, after),
    }


def handoff_cost(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """An instance's KV hand-offs over the mix and its step thread's microseconds a hand-off
    (the serving core's own clock: kv_handoff_step_seconds over kv_handoffs)."""
    p = "trtllm_gateway:"
    n = _sum(after, p + "kv_handoffs_total") - _sum(before, p + "kv_handoffs_total")
    s = _sum(after, p + "kv_handoff_step_seconds_total") - _sum(
        before, p + "kv_handoff_step_seconds_total"
    )
    return {"handoffs": n, "step_us_per_handoff": s / n * 1e6 if n else 0.0}


def _warm(urls: list[str], args: argparse.Namespace) -> None:
    """One long and one short request per instance (kernels, graphs, the sibling path)."""
    warm = [MixClass("long", args.long_len, len(urls), 1, 7), MixClass("short", 8, len(urls), 1, 8)]
    for cls in warm:
        run_mix(urls, [cls], 4)


def run_setup(name: str, args: argparse.Namespace, gpus: list[str]) -> dict[str, Any]:
    # Siblings present a shared internal key (without one their endpoints answer 403).
    extra = [*shlex.split(args.serve_args), "--internal-api-key", secrets.token_hex(16)]
    logs = Path(args.log_dir)
    classes = [
        MixClass("long", args.long_len, args.num_prompts, args.concurrency, 1),
        MixClass("short", args.short_len, args.num_prompts, args.concurrency, 2),
    ]
    started: list[Instance] = []
    try:
        if name == "agg":
            started.append(Instance("agg", extra, gpus[0], logs).ready())
            urls = [started[0].url]
        elif name == "agg2":
            started += [Instance(f"agg2-{i}", extra, gpus[i], logs) for i in (0, 1)]
            urls = [inst.ready().url for inst in started]
        else:
            prefill = ["--mode", "prefill", *shlex.split(args.prefill_args), *extra]
            pre = Instance("prefill", prefill, gpus[0], logs, see_all=True).ready()
            started.append(pre)
            decode = ["--mode", "decode", "--prefill-url", pre.url, *shlex.split(args.decode_args)]
            started.append(Instance("decode", [*decode, *extra], gpus[1], logs, True).ready())
            urls = [started[1].url]
        _warm(urls, args)
        time.sleep(1.5)  # the warm-up's counts in the shared files (as after the mix)
        before = _metrics(urls[0])
        before_prefill = _metrics(started[0].url) if name == "pd" else {}
        t0 = time.time()
        report = figures(run_mix(urls, classes, args.output_len), args.ttft_slo, args.itl_slo)
        report["started_at"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0))
        if name == "pd":
            time.sleep(1.5)  # every API server's own counters reach the shared files each second
            counters = path_counters(before, _metrics(urls[0]))
            report["decode_counters"] = counters
            report["prefill_counters"] = handoff_cost(before_prefill, _metrics(started[0].url))
            failed = counters["paths"]["local_fallback"] + counters["paths"]["failed"]
            if failed:  # a broken pair measures the decode instance alone: say so loudly
                print(f"pd: {failed:.0f} prompts failed over; see {logs}", file=sys.stderr)
        return report
    finally:
        for inst in started:
            inst.stop()


def table(results: dict[str, dict[str, Any]]) -> str:
    names = {"agg": "aggregated", "pd": "prefill + decode", "agg2": "two aggregated (round robin)"}
    gpus = {"agg": 1, "pd": 2, "agg2": 2}
    rows = [
        "| setup | GPUs | long tok/s | long TTFT p50 / p99 (s) | short TTFT p50 / p99 (s) "
        "| ITL p99 long / short (ms) | wall (s) | total tok/s | goodput (req/s, met) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        c = r["classes"]
        lt, st = c["long"]["ttft_ms"], c["short"]["ttft_ms"]
        rows.append(
            f"| {names[key]} | {gpus[key]} | {c['long']['output_tok_s']:.3g} "
            f"| {lt['p50'] / 1e3:.2f} / {lt['p99'] / 1e3:.2f} "
            f"| {st['p50'] / 1e3:.2f} / {st['p99'] / 1e3:.2f} "
            f"| {c['long']['itl_ms']['p99']:.1f} / {c['short']['itl_ms']['p99']:.1f} "
            f"| {r['wall_s']:.1f} | {r['output_tok_s']:.3g} "
            f"| {r['goodput_req_s']:.2f} ({r['met_slo']}/{r['requests']}) |"
        )
    return "\n".join(rows)


def environment() -> dict[str, Any]:
    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "gpus": run(query).splitlines(),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    p.add_argument("--setups", default="agg,pd,agg2", help="comma list of agg, pd, agg2")
    p.add_argument("--long-len", type=int)
    p.add_argument("--short-len", type=int)
    p.add_argument("--num-prompts", type=int, help="per class")
    p.add_argument("--concurrency", type=int, help="per class")
    p.add_argument("--output-len", type=int)
    p.add_argument("--gpus", help="two CUDA device ids, comma list ('' on the CPU)")
    p.add_argument("--serve-args", help="flags of every server (the preset's if not given)")
    p.add_argument("--tokenizer", default=None, help="a tokenizer.json directory (GPU preset)")
    p.add_argument("--decode-args", default="--max-local-prefill-tokens 256")
    p.add_argument("--prefill-args", default="", help="flags of the prefill instance alone")
    p.add_argument("--ttft-slo", type=float, default=2.0, help="seconds (issue 41: 2)")
    p.add_argument("--itl-slo", type=float, default=0.05, help="seconds, a request's ITL p99")
    p.add_argument("--log-dir", default="/tmp")
    p.add_argument("--out", default=None, help="write the JSON report here")
    args = p.parse_args(argv)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.tokenizer:
        args.serve_args += f" --tokenizer {args.tokenizer}"
    gpus = args.gpus.split(",") if args.gpus else ["", ""]
    report: dict[str, Any] = {"args": vars(args), "env": environment(), "results": {}}
    for name in args.setups.split(","):
        print(f"{time.strftime('%H:%M:%S')} {name}", file=sys.stderr, flush=True)
        report["results"][name] = run_setup(name, args, gpus)
    report["env"]["loadavg_after"] = os.getloadavg()
    report["table"] = table(report["results"])
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    print(report["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

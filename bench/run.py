"""`make bench`: the CPU suite (real SmolLM2 behind the HTTP server) and docs/benchmarks.md.

Starts `python -m trtllm_gateway serve` on the default model (CPU, dtype auto), waits for
/health, runs
bench.serve at concurrency 1, 8 and 32 (random 128-token prompts, 128 output tokens, ignore_eos,
streaming), notes the machine load before each run, and rewrites the CPU section of
docs/benchmarks.md. --gpu-summary FILE pastes a bench/gpu_suite.sh summary into the GPU section.

  python -m bench.run                      # CPU suite, then update docs/benchmarks.md
  python -m bench.run --gpu-summary /tmp/bench-gpu/summary.md --skip-cpu
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

DOC = Path("docs/benchmarks.md")
REFERENCE = {1: 129.0, 8: 237.0, 32: 299.0}  # llama.cpp server, same GGUF, same kind of machine


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_suite(args: argparse.Namespace) -> dict[str, Any]:
    port = str(args.port)
    server_cmd = [
        sys.executable,
        "-m",
        "trtllm_gateway",
        "serve",
        "--device",
        "cpu",
        "--port",
        port,
    ]
    server_cmd += ["--max-batch-size", "32", "--log-level", "warning", *args.server_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(server_cmd, env=env)
    runs = []
    try:
        for conc in args.concurrency:
            n = max(args.min_prompts, 2 * conc)
            cmd = [sys.executable, "-m", "bench.serve", "--base-url", f"http://127.0.0.1:{port}"]
            cmd += ["--num-prompts", str(n), "--input-len", str(args.input_len)]
            cmd += ["--output-len", str(args.output_len), "--max-concurrency", str(conc)]
            cmd += ["--vocab-size", "49152", "--warmup", "2"]
            load = _load()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["load_before"] = load
            r["load_after"] = _load()
            runs.append(r)
            print(json.dumps(r), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    import torch

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(["python -m bench.run", *sys.argv[1:]]),
        "server": " ".join(["trtllm-gateway serve", *server_cmd[4:]]),
        "runs": runs,
    }


def cpu_markdown(res: dict[str, Any]) -> str:
    lines = [
        f"Measured {res['date']} on {res['cpu']} ({res['cores']} cores), torch {res['torch']}, "
        f"Python {res['python']}. Command: `{res['command']}` (server: `{res['server']}`). "
        "Real SmolLM2-135M-Instruct (the packaged GGUF, dequantized), dtype auto, streaming "
        "/v1/completions, random prompts, ignore_eos.",
        "",
        "| Concurrency | Output tok/s | llama.cpp | Target | TTFT p50 / p99 (ms) | TPOT mean (ms) "
        "| ITL p50 / p99 (ms) | Load before / after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["runs"]:
        c = r["max_concurrency"]
        ref = REFERENCE.get(c, float("nan"))
        target = ref / 2 if c == 1 else ref
        met = r["output_throughput"] >= target if c == 1 else r["output_throughput"] > target
        lines.append(
            f"| {c} ({r['input_len']} in / {r['output_len']} out, {r['num_prompts']} requests) | "
            f"**{r['output_throughput']:.1f}** | {ref:.0f} | {'>=' if c == 1 else '>'} "
            f"{target:.0f} ({'met' if met else 'not met'}) | {r['ttft_ms']['p50']:.0f} / "
            f"{r['ttft_ms']['p99']:.0f} | {r['tpot_ms']['mean']:.1f} | {r['itl_ms']['p50']:.1f} / "
            f"{r['itl_ms']['p99']:.1f} | {r['load_before']} / {r['load_after']} |"
        )
    return "\n".join(lines) + "\n"


def replace_section(doc: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in doc:
        return doc + f"\n{begin}\n{body}{end}\n"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--min-prompts", type=int, default=4)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[])
    p.add_argument("--skip-cpu", action="store_true")
    p.add_argument("--gpu-summary", type=Path, default=None)
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args()
    res = None if args.skip_cpu else cpu_suite(args)
    # Read the document only now: it may have been edited while the benchmark ran.
    doc = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if args.gpu_summary is not None:
        doc = replace_section(doc, "gpu", args.gpu_summary.read_text())
    if res is not None:
        if args.json_out is not None:
            args.json_out.write_text(json.dumps(res, indent=1))
        doc = replace_section(doc, "cpu", cpu_markdown(res))
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(doc)
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()

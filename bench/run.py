"""`make bench`: the CPU suite (real SmolLM2 behind the HTTP server) and docs/benchmarks.md.

Starts `python -m trtllm_gateway serve` on the default model (CPU, dtype auto), waits for
/health, runs bench.serve at concurrency 1, 8 and 32 (random 128-token prompts, 128 output tokens,
ignore_eos, streaming), notes the machine load before each run, and writes docs/benchmarks.md
with a new CPU section to bench-results/benchmarks.md (--doc docs/benchmarks.md updates the doc).
With --llama-server PATH the same client, prompts and concurrencies then run against
llama.cpp's server on the same GGUF (2 threads, one slot per concurrent request), in the same run,
and the table compares the two. --gpu-summary FILE pastes a bench/gpu_suite.sh summary
into the GPU section.

  python -m bench.run                      # CPU suite -> bench-results/benchmarks.md
  python -m bench.run --doc docs/benchmarks.md   # ... and update the tracked doc
  python -m bench.run --llama-server /path/to/llama-server
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
import time
from pathlib import Path
from typing import Any

DOC = Path("docs/benchmarks.md")
# `make bench` writes here (a copy of DOC with the new sections); docs/benchmarks.md changes only
# when asked for with --doc docs/benchmarks.md.
RESULTS = Path("bench-results/benchmarks.md")
# llama.cpp's server, same GGUF, same kind of machine, measured in an earlier session: the
# reference when --llama-server is not given.
REFERENCE = {1: 129.0, 8: 237.0, 32: 299.0}
# Issue 28's targets: the gateway's output tok/s over llama.cpp's, measured in one run, with the
# default settings and with --packed-weights int8 (llama.cpp's own arithmetic).
TARGET_RATIO = {1: 0.8, 8: 1.2, 32: 1.5}
TARGET_RATIO_INT8 = {1: 1.0, 8: 1.5, 32: 2.0}


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


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 600.0) -> None:
    """Poll GET url until 200 (a model load can take minutes on a first start)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


def _measure(args: argparse.Namespace, server_cmd: list[str], health: str) -> list[dict[str, Any]]:
    """Start one server, run bench.serve at each concurrency, stop it: one server at a time, since
    an idle llama.cpp server keeps threads spinning (about a quarter of a core on 2 cores)."""
    port = str(args.port)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(server_cmd, env=env)
    runs = []
    try:
        _wait_ready(f"http://127.0.0.1:{port}{health}", server)
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
    return runs


def llama_server_cmd(args: argparse.Namespace) -> list[str]:
    """llama.cpp's server on the GGUF the gateway loads: 2 threads, a slot per concurrent request,
    continuous batching (its default), each slot with room for the prompt and the output."""
    from trtllm_gateway.engine.model_source import default_gguf

    slots = max(args.concurrency)
    ctx = slots * (args.input_len + args.output_len + 16)
    return [
        str(args.llama_server), "-m", str(default_gguf()), "--port", str(args.port),
        "--host", "127.0.0.1", "-t", "2", "-tb", "2", "-np", str(slots), "-c", str(ctx),
        "--no-webui", "--log-disable",
    ]  # fmt: skip


def cpu_suite(args: argparse.Namespace) -> dict[str, Any]:
    server_cmd = [sys.executable, "-m", "trtllm_gateway", "serve", "--device", "cpu"]
    server_cmd += ["--port", str(args.port), "--max-batch-size", "32", "--log-level", "warning"]
    server_cmd += args.server_args
    runs = _measure(args, server_cmd, "/health")
    llama_runs: list[dict[str, Any]] = []
    llama_cmd: list[str] = []
    if args.llama_server is not None:
        llama_cmd = llama_server_cmd(args)
        llama_runs = _measure(args, llama_cmd, "/health")
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
        "llama_server": " ".join(["llama-server", *llama_cmd[1:]]) if llama_cmd else None,
        "llama_version": _llama_version(args.llama_server),
        "llama_runs": llama_runs,
    }


def _llama_version(path: Path | None) -> str | None:
    if path is None:
        return None
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=False)
    return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr) else None


def cpu_markdown(res: dict[str, Any]) -> str:
    same_run = bool(res.get("llama_runs"))
    lines = [
        f"Measured {res['date']} on {res['cpu']} ({res['cores']} cores), torch {res['torch']}, "
        f"Python {res['python']}. Command: `{res['command']}` (server: `{res['server']}`). "
        "Real SmolLM2-135M-Instruct (the packaged GGUF, dequantized), dtype auto, streaming "
        "/v1/completions, random prompts, ignore_eos.",
    ]
    if same_run:
        lines[0] += (
            f" llama.cpp in the same run, after the gateway, same client and prompts: "
            f"`{res['llama_server']}` ({res['llama_version']})."
        )
    else:
        lines[0] += " llama.cpp: the earlier session's figures (not this run)."
    lines += [
        "",
        "| Concurrency | Output tok/s | llama.cpp | Ratio | Target | TTFT p50 / p99 (ms) "
        "| TPOT mean (ms) | ITL p50 / p99 (ms) | Load before / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    llama = {r["max_concurrency"]: r for r in res.get("llama_runs") or []}
    for r in res["runs"]:
        c = r["max_concurrency"]
        ref = llama[c]["output_throughput"] if c in llama else REFERENCE.get(c, float("nan"))
        ratio = r["output_throughput"] / ref
        want = (TARGET_RATIO_INT8 if "int8" in res["server"].split() else TARGET_RATIO).get(c)
        target = "none" if want is None else f">= {want}x ({'met' if ratio >= want else 'not met'})"
        lines.append(
            f"| {c} ({r['input_len']} in / {r['output_len']} out, {r['num_prompts']} requests) | "
            f"**{r['output_throughput']:.1f}** | {ref:.1f} | {ratio:.2f}x | {target} "
            f"| {r['ttft_ms']['p50']:.0f} / "
            f"{r['ttft_ms']['p99']:.0f} | {r['tpot_ms']['mean']:.1f} | {r['itl_ms']['p50']:.1f} / "
            f"{r['itl_ms']['p99']:.1f} | {r['load_before']} / {r['load_after']} |"
        )
    for r in res.get("llama_runs") or []:
        lines.append(
            f"| llama.cpp, {r['max_concurrency']} | {r['output_throughput']:.1f} | | | | "
            f"{r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p99']:.0f} | {r['tpot_ms']['mean']:.1f} "
            f"| {r['itl_ms']['p50']:.1f} / {r['itl_ms']['p99']:.1f} "
            f"| {r['load_before']} / {r['load_after']} |"
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
    p.add_argument(
        "--llama-server", type=Path, default=None, help="llama.cpp's llama-server binary"
    )
    p.add_argument("--gpu-summary", type=Path, default=None)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument(
        "--doc",
        type=Path,
        default=RESULTS,
        help=f"the Markdown file to write (default {RESULTS}, from {DOC}; --doc {DOC} updates it)",
    )
    args = p.parse_args()
    res = None if args.skip_cpu else cpu_suite(args)
    # Read the document only now: it may have been edited while the benchmark ran.
    source = args.doc if args.doc.exists() else DOC
    doc = source.read_text() if source.exists() else "# Benchmarks\n"
    if args.gpu_summary is not None:
        doc = replace_section(doc, "gpu", args.gpu_summary.read_text())
    if res is not None:
        if args.json_out is not None:
            args.json_out.write_text(json.dumps(res, indent=1))
        doc = replace_section(doc, "cpu", cpu_markdown(res))
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(doc)
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()

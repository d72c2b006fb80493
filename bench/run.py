"""`make bench`: the CPU suite (real SmolLM2 behind the HTTP server) and docs/benchmarks.md.

Starts `python -m trtllm_gateway serve` on the default model (CPU, dtype auto), runs bench.serve
at concurrency 1, 8 and 32 (random 128-token prompts, 128 output tokens, ignore_eos, streaming
/v1/completions), notes the load and the server's run-queue wait with every run, and writes
docs/benchmarks.md with a new CPU section to bench-results/benchmarks.md, and the section it
replaced to the top of bench-results/benchmarks_history.md (--doc docs/benchmarks.md updates the
two tracked files; bench/doc_sections.py). --gpu-summary FILE pastes a bench/gpu_suite.sh summary
into the GPU section the same way.

With --llama-server PATH it is a race (bench/race.py): llama.cpp's server on the same GGUF is
started beside the gateway, as its users run it: from the shell's environment less the project's
variables (bench/peer_env.py; what differs is printed) and with its own defaults but for the
slots and context the concurrency needs. Both stay loaded; --rounds rounds, each measuring both
at every concurrency back to back (the order rotating), the idle one frozen with SIGSTOP; the
table gives the median of the pairwise ratios and their spread.

  python -m bench.run                      # CPU suite -> bench-results/benchmarks.md
  python -m bench.run --doc docs/benchmarks.md   # ... and update the tracked doc
  python -m bench.run --llama-server /path/to/llama-server --rounds 4
  python -m bench.run --gpu-summary /tmp/bench-gpu/summary.md --skip-cpu
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.doc_sections import archive, history_path, replace_section
from bench.peer_env import added_since_start, differences, peer_env
from bench.race import Server, load, race, ratios, summarize

DOC = Path("docs/benchmarks.md")
# `make bench` writes here (a copy of DOC with the new sections, and the history beside it);
# docs/benchmarks.md and docs/benchmarks_history.md change only when asked for with --doc.
RESULTS = Path("bench-results/benchmarks.md")
# Issue 36's targets: the gateway's output tok/s over llama.cpp's at concurrency 1 / 8 / 32, in a
# fair race (both servers loaded, interleaved rounds, llama.cpp in a clean environment), with the
# default settings; and TTFT p50 at concurrency 1 no worse than llama.cpp's.
TARGET_RATIO = {1: 1.0, 8: 1.5, 32: 2.0}


def _load() -> str:
    return load()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _isa() -> str:
    """The vector extensions of this CPU that the kernels choose between."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ).split()  # fmt: skip
    except (OSError, StopIteration):
        return "unknown"
    want = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile")
    return " ".join(f for f in want if f in flags) or "no AVX2"


def llama_server_cmd(args: argparse.Namespace, port: int) -> list[str]:
    """llama.cpp's server on the GGUF the gateway loads, with its own defaults (threads, batch
    sizes, flash attention, continuous batching) but for what the race needs: a slot per
    concurrent request (-np) and a context that holds every slot's prompt and output."""
    from trtllm_gateway.engine.model_source import default_gguf

    slots = max(args.concurrency)
    ctx = slots * (args.input_len + args.output_len + 16)
    return [
        str(args.llama_server), "-m", str(default_gguf()), "--port", str(port),
        "--host", "127.0.0.1", "-np", str(slots), "-c", str(ctx),
        "--no-webui", "--log-disable", *shlex.split(args.llama_args),
    ]  # fmt: skip


def gateway_cmd(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "trtllm_gateway", "serve", "--device", "cpu"]
    cmd += ["--port", str(port), "--max-batch-size", "32", "--log-level", "warning"]
    return [*cmd, *args.server_args]


def servers(args: argparse.Namespace) -> list[Server]:
    """The gateway (this process's environment: the shell's, and what the user set for it), and
    with --llama-server llama.cpp's server (the shell's less the project's variables)."""
    ours = dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
    out = [Server("gateway", gateway_cmd(args, args.port), ours, args.port)]
    if args.llama_server is not None:
        port = args.port + 1
        out.append(Server("llama.cpp", llama_server_cmd(args, port), peer_env(), port))
    return out


def cpu_suite(args: argparse.Namespace) -> dict[str, Any]:
    race_servers = servers(args)
    print("this process's environment, against the shell's:",
          *added_since_start() or ["(same)"], sep="\n  ", flush=True)  # fmt: skip
    for s in race_servers[1:]:
        print(f"{s.name}'s environment, against the shell's:", *differences(s.env) or ["(same)"],
              sep="\n  ", flush=True)  # fmt: skip
    runs = race(race_servers, args)
    import torch

    res: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_name(),
        "isa": _isa(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(["python -m bench.run", *sys.argv[1:]]),
        "server": " ".join(["trtllm-gateway serve", *race_servers[0].cmd[4:]]),
        "gateway_env": sorted(k for k in os.environ if k.startswith(("GATEWAY_", "OMP_", "GOMP_"))),
        "rounds": args.rounds,
        "idle_s": args.idle_s,
        "runs": runs["gateway"],
        "llama_server": None,
        "llama_version": _llama_version(args.llama_server),
        "llama_env": None,
        "llama_runs": runs.get("llama.cpp", []),
    }
    if len(race_servers) > 1:
        res["llama_server"] = " ".join(["llama-server", *race_servers[1].cmd[1:]])
        res["llama_env"] = differences(race_servers[1].env)
    return res


def _llama_version(path: Path | None) -> str | None:
    if path is None:
        return None
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, check=False)
    text = (out.stdout + out.stderr).strip().splitlines()
    return next((line for line in text if line.startswith("version")), text[0] if text else None)


def cpu_markdown(res: dict[str, Any]) -> str:
    head = (
        f"Measured {res['date']} on {res['cpu']} ({res['cores']} cores; {res['isa']}), torch "
        f"{res['torch']}, Python {res['python']}. Command: `{res['command']}` (server: "
        f"`{res['server']}`; gateway variables set: {', '.join(res['gateway_env']) or 'none'}). "
        "Real SmolLM2-135M-Instruct (the packaged Q4_1 GGUF), streaming /v1/completions, random "
        f"{res['runs'][0]['input_len']}-token prompts, {res['runs'][0]['output_len']} output "
        f"tokens, ignore_eos, greedy; {res['rounds']} round(s), new prompts each round."
    )
    if res.get("llama_runs"):
        head += (
            f" llama.cpp in the same run, both servers loaded, the idle one frozen (SIGSTOP), "
            f"the order rotating each round: `{res['llama_server']}` ({res['llama_version']}); "
            f"its environment against the shell's: "
            f"{'; '.join(f'`{d}`' for d in res['llama_env']) or 'the same'}."
        )
    lines = [
        head,
        "",
        "| Concurrency | Gateway tok/s (median; rounds) | llama.cpp tok/s (median; rounds) "
        "| Ratio (median of pairs; min-max) | Target | TTFT p50 ms (gateway / llama.cpp) "
        "| ITL p50 ms (gateway / llama.cpp) | Load, 1 min (gateway; llama.cpp) "
        "| Run-queue wait (gateway; llama.cpp) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted({r["max_concurrency"] for r in res["runs"] if "max_concurrency" in r}):
        g = summarize(res["runs"], c)
        row = f"| {c} | **{g['tok_s']:.1f}** ({', '.join(map(str, g['tok_s_all']))}) "
        if res.get("llama_runs"):
            ll = summarize(res["llama_runs"], c)
            rs = ratios(res["runs"], res["llama_runs"], c)
            ratio = statistics.median(rs)
            want = TARGET_RATIO.get(c)
            target = "" if want is None else f">= {want}x ({'met' if ratio >= want else 'not met'})"
            if c == 1:
                ok = g["ttft_p50"] <= ll["ttft_p50"]
                target += f"; TTFT <= llama.cpp's ({'met' if ok else 'not met'})"
            row += (
                f"| {ll['tok_s']:.1f} ({', '.join(map(str, ll['tok_s_all']))}) "
                f"| **{ratio:.2f}x** ({min(rs):.2f}-{max(rs):.2f}) | {target} "
                f"| {g['ttft_p50']:.0f} / {ll['ttft_p50']:.0f} "
                f"| {g['itl_p50']:.1f} / {ll['itl_p50']:.1f} "
                f"| {', '.join(g['load'])}; {', '.join(ll['load'])} "
                f"| {', '.join(map(str, g['wait']))}; {', '.join(map(str, ll['wait']))} |"
            )
        else:
            row += (
                f"| | | | {g['ttft_p50']:.0f} | {g['itl_p50']:.1f} | {', '.join(g['load'])} "
                f"| {', '.join(map(str, g['wait']))} |"
            )
        lines.append(row)
    idle = [
        f"{name} {r['idle_cpu_pct']}%"
        for name, key in (("gateway", "runs"), ("llama.cpp", "llama_runs"))
        for r in res.get(key) or []
        if "idle_cpu_pct" in r
    ]
    if idle:
        lines += [
            "",
            f"CPU of each idle server over {res['idle_s']:g} s right after its last requests "
            f"(its whole process tree, % of one core): {', '.join(idle)}.",
        ]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--min-prompts", type=int, default=4)
    p.add_argument("--port", type=int, default=8765, help="the gateway's; llama.cpp's is +1")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (a race: 4)")
    p.add_argument(
        "--llama-args", default="", help="more llama-server flags, one string: --llama-args='-t 2'"
    )
    p.add_argument(
        "--idle-s", type=float, default=60.0, help="then each server's CPU idle this long (0: no)"
    )
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
    return p


def main() -> None:
    args = parser().parse_args()
    res = None if args.skip_cpu else cpu_suite(args)
    # Read the documents only now: they may have been edited while the benchmark ran.
    source = args.doc if args.doc.exists() else DOC
    doc = source.read_text() if source.exists() else "# Benchmarks\n"
    hist_out = history_path(args.doc)
    hist_source = hist_out if hist_out.exists() else history_path(DOC)
    history = hist_source.read_text() if hist_source.exists() else ""
    sections = []
    if args.gpu_summary is not None:
        sections.append(("gpu", args.gpu_summary.read_text()))
    if res is not None:
        if args.json_out is not None:
            args.json_out.write_text(json.dumps(res, indent=1))
        sections.append(("cpu", cpu_markdown(res)))
    today = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    for name, body in sections:
        doc, old = replace_section(doc, name, body)
        if old is not None:
            history = archive(history, name, old, today)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(doc)
    if history:
        hist_out.write_text(history)
    print(f"wrote {args.doc} and {hist_out}")


if __name__ == "__main__":
    main()

"""Markdown summary of one bench/gpu_suite.sh run (its output directory) for docs/benchmarks.md.

python -m bench.report_gpu /tmp/bench-gpu > summary.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _load(d: Path, name: str) -> dict[str, Any]:
    try:
        return dict(json.loads((d / name).read_text().strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError):
        return {}


def _ms(x: dict[str, float]) -> str:
    return f"{x['mean']:.1f} / {x['p50']:.1f} / {x['p90']:.1f} / {x['p99']:.1f}"


def summary(d: Path) -> str:
    env = (d / "env.txt").read_text().strip().splitlines() if (d / "env.txt").exists() else []
    off8, hf, off135 = (_load(d, n) for n in ("offline_8b.json", "hf_8b.json", "offline_135m.json"))
    served = {si: _load(d, f"serve_135m_si{si}.json") for si in (1, 8)}
    lines = ["Run: " + " | ".join(env), ""]
    lines += ["| # | Figure | Measured | Target | Met |", "|---|---|---|---|---|"]
    lat = off8.get("decode_latency")
    if lat:
        roof = lat["roofline"]
        frac = lat["fraction_of_roofline"]
        ms = lat["ms_per_token_median"]
        lines.append(
            f"| 1 | 8B batch-1 decode (ctx {lat['input_len']}+{lat['output_len']}) | "
            f"{ms:.2f} ms/token ({1e3 / ms:.0f} tok/s); roofline {roof['roofline_ms']:.2f} ms = "
            f"{roof['weight_bytes'] / 1e9:.2f} GB weights + {roof['kv_bytes'] / 1e9:.2f} GB KV at "
            f"{roof['copy_bandwidth_GBps']:.0f} GB/s measured copy: **{frac:.0%} of roofline** | "
            f">= 85% | {'yes' if frac >= 0.85 else 'no'} |"
        )
    run8 = (off8.get("runs") or [{}])[0]
    if run8:
        tps = run8["output_tok_s"]
        lines.append(
            f"| 2 | 8B offline, {run8['num_prompts']} x {run8['input_len']}/{run8['output_len']} "
            f"(max {off8.get('max_running')} running) | **{tps:,.0f} output tok/s** "
            f"({run8['duration_s']:.1f} s) | 10,000 on an H100 | see notes |"
        )
        if hf.get("output_tok_s"):
            ratio = tps / hf["output_tok_s"]
            lines.append(
                f"| 2b | HF transformers {hf['transformers']} `generate`, batch {hf['batch']}, "
                f"{hf['input_len']}/{hf['output_len']} | {hf['output_tok_s']:,.0f} output tok/s; "
                f"engine / HF = **{ratio:.1f}x** | >= 8x | {'yes' if ratio >= 8 else 'no'} |"
            )
    run135 = (off135.get("runs") or [{}])[0]
    for si, srv in served.items():
        if not (run135 and srv.get("output_throughput")):
            continue
        frac = srv["output_throughput"] / run135["output_tok_s"]
        chunks = "one token per chunk" if si == 1 else f"`--stream-interval {si}`"
        lines.append(
            f"| 3 | 135M, 512 x 1024/1024, concurrency 256: HTTP streaming ({chunks}) vs "
            f"offline | {srv['output_throughput']:,.0f} vs {run135['output_tok_s']:,.0f} output "
            f"tok/s: **{frac:.0%}** ({srv['completed']} ok, {srv['failed']} failed) | >= 85% | "
            f"{'yes' if frac >= 0.85 else 'no'} |"
        )
    lines += ["", "Latency (ms, mean / p50 / p90 / p99):", ""]
    lines += ["| Run | TTFT | TPOT | ITL (per chunk) |", "|---|---|---|---|"]
    for name, r in (("8B offline", run8), ("135M offline", run135)):
        if r:
            lines.append(f"| {name} | {_ms(r['ttft_ms'])} | {_ms(r['tpot_ms'])} | - |")
    for si, srv in served.items():
        if srv.get("ttft_ms"):
            lines.append(
                f"| 135M HTTP, stream interval {si} | {_ms(srv['ttft_ms'])} | "
                f"{_ms(srv['tpot_ms'])} | {_ms(srv['itl_ms'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    print(summary(Path(sys.argv[1])), end="")


if __name__ == "__main__":
    main()

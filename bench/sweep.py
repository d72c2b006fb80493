"""Performance sweep: engine configs x concurrencies x (ISL, OSL), one JSON per point, plots.

For each engine config of the grid (bench/sweep_grid.py: aggregated, prefill+decode, or the URL
of any running OpenAI server), starts its servers, waits for /health, warms up, then runs the
serving benchmark (bench.serve, or AIPerf with --loadgen aiperf) at each concurrency. Writes
points/*.json, summary.csv, PNG charts (output tok/s per GPU vs tok/s per user with the Pareto
front, TTFT and ITL vs concurrency) and an index.html to open.

    python -m bench.sweep --grid bench/sweep_cpu.yaml --out /tmp/sweep
    trtllm-gateway bench sweep --grid bench/sweep_cpu.yaml --url peer=http://10.0.0.2:8000
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from bench.run import _cpu_name, _load
from bench.serve import prefix_cache_hits
from bench.sweep_grid import EngineConfig, Grid, load_grid
from bench.sweep_loadgen import LOADGENS, aiperf_available, run_aiperf, run_builtin
from bench.sweep_plots import COLUMNS, draw_all, write_index
from bench.sweep_servers import serving

DEFAULT_GRID = Path(__file__).with_name("sweep_cpu.yaml")


def point_name(cfg: EngineConfig, concurrency: int, isl: int, osl: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in cfg.name)
    return f"{safe}-isl{isl}-osl{osl}-c{concurrency}.json"


def run_point(
    args: argparse.Namespace,
    grid: Grid,
    cfg: EngineConfig,
    url: str,
    c: int,
    isl: int,
    osl: int,
    seed: int = 0,
) -> dict[str, Any]:
    """One point against a server that served the config's points before it: seed gives it
    prompts of its own (the same seed for the same point of every config)."""
    n = grid.num_requests(c)
    load = _load()
    hits = prefix_cache_hits(url) or 0.0
    if args.loadgen == "aiperf":
        tag = point_name(cfg, c, isl, osl).removesuffix(".json")
        metrics = run_aiperf(url, c, isl, osl, n, args.out / "aiperf" / tag, args.tokenizer)
    else:
        metrics = run_builtin(url, c, isl, osl, n, grid.warmup, args.vocab_size, grid.workers, seed)
    return {
        "config": cfg.name,
        "kind": cfg.kind,
        "gpus": cfg.gpus,
        "concurrency": c,
        "isl": isl,
        "osl": osl,
        "num_requests": n,
        "loadgen": args.loadgen,
        **metrics,
        "output_tok_s_per_gpu": metrics["output_throughput"] / cfg.gpus,
        "load_before": load,
        "load_after": _load(),
        # 0: the point's prompts are new to the server
        "prefix_cache_hit_tokens": (prefix_cache_hits(url) or 0.0) - hits,
    }


def sweep(args: argparse.Namespace, grid: Grid) -> list[dict[str, Any]]:
    points_dir = args.out / "points"
    points_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    todo = grid.points()
    bar = tqdm(total=len(todo), unit="point", desc=grid.name)
    try:
        for cfg in grid.configs:
            mine = [p for p in todo if p[0] is cfg]
            done = [p for p in mine if (points_dir / point_name(*p)).exists()]
            if args.resume and len(done) == len(mine):
                rows += [json.loads((points_dir / point_name(*p)).read_text()) for p in mine]
                bar.update(len(mine))
                continue
            with serving(cfg, grid.serve_args, args.out) as url:
                for i, (_, c, isl, osl) in enumerate(mine):
                    path = points_dir / point_name(cfg, c, isl, osl)
                    if args.resume and path.exists():
                        row = json.loads(path.read_text())
                    else:
                        bar.set_postfix_str(f"{cfg.name} c={c} isl={isl} osl={osl}")
                        row = run_point(args, grid, cfg, url, c, isl, osl, seed=100 * i)
                        path.write_text(json.dumps(row, indent=1))
                    rows.append(row)
                    bar.update(1)
    finally:
        bar.close()
    return rows


def write_summary(rows: list[dict[str, Any]], out: Path) -> Path:
    path = out / "summary.csv"
    keys = list(COLUMNS) + sorted({k for r in rows for k in r} - set(COLUMNS) - {"errors"})
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True)
        return out.stdout.decode().strip() or "n/a"
    except OSError:
        return "n/a"


def metadata(args: argparse.Namespace, grid: Grid) -> dict[str, Any]:
    return {
        "grid": grid.name,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu_name()} ({os.cpu_count()} cores), load {_load()}",
        "python": platform.python_version(),
        "commit": _git_commit(),
        "loadgen": args.loadgen,
        "common serve args": " ".join(grid.serve_args) or "(none)",
        "configs": "; ".join(_describe(c) for c in grid.configs),
    }


def _describe(cfg: EngineConfig) -> str:
    if cfg.kind == "url":
        what = f"{cfg.url}"
    elif cfg.kind == "aggregated":
        what = " ".join(cfg.serve_args) or "defaults"
    else:
        what = f"prefill: {' '.join(cfg.prefill_args)} / decode: {' '.join(cfg.decode_args)}"
    return f"{cfg.name} ({cfg.kind}, {cfg.gpus} GPU): {what}"


def with_urls(grid: Grid, urls: list[str]) -> Grid:
    """--url NAME=URL adds a running server (a peer) as one more config of the chart."""
    extra = []
    for spec in urls:
        name, sep, url = spec.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise SystemExit(f"--url {spec!r}: expected NAME=http://host:port")
        extra.append(EngineConfig(name=name, kind="url", url=url))
    return replace(grid, configs=grid.configs + tuple(extra))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trtllm-gateway bench sweep",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--grid", type=Path, default=DEFAULT_GRID, help="grid YAML")
    p.add_argument("--out", type=Path, default=Path("sweep-results"), help="result directory")
    p.add_argument("--loadgen", choices=LOADGENS, default="builtin")
    p.add_argument("--tokenizer", default=None, help="aiperf: a local tokenizer dir (offline)")
    p.add_argument("--url", action="append", default=[], help="NAME=URL of a running server")
    p.add_argument("--only", action="append", default=[], help="run only these config names")
    p.add_argument("--vocab-size", type=int, default=49152, help="random prompt ids below this")
    p.add_argument("--resume", action="store_true", help="keep points already written")
    p.add_argument("--plots-only", action="store_true", help="redraw from points/*.json")
    p.add_argument("--no-plots", action="store_true", help="points and CSV only (no matplotlib)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    grid = with_urls(load_grid(args.grid), args.url)
    if args.only:
        grid = replace(grid, configs=tuple(c for c in grid.configs if c.name in args.only))
    if args.loadgen == "aiperf" and not aiperf_available():
        raise SystemExit(
            "--loadgen aiperf: the aiperf command is not installed (pip install aiperf)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    meta_path = args.out / "meta.json"
    if args.plots_only:
        rows = [json.loads(p.read_text()) for p in sorted((args.out / "points").glob("*.json"))]
        # The run's own metadata (machine, date, commit), not the machine that redraws.
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else metadata(args, grid)
    else:
        meta = metadata(args, grid)
        meta_path.write_text(json.dumps(meta, indent=1))
        rows = sweep(args, grid)
    write_summary(rows, args.out)
    plots = [] if args.no_plots else draw_all(rows, grid.name, args.out)
    index = write_index(rows, plots, meta, args.out)
    print(f"wrote {index}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Sweep charts (matplotlib, PNG) and the result directory's index.html.

Per (ISL, OSL): output tok/s per GPU against tok/s per user, one line per engine config with the
Pareto front over all configs marked; TTFT and ITL against concurrency.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Row = dict[str, Any]


def _pyplot() -> Any:
    """matplotlib only when drawing (a GPU box running points need not have it)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (both maximized), by x."""
    finite = [i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)]
    front = []
    for i in finite:
        xi, yi = points[i]
        dominated = any(
            points[j][0] >= xi and points[j][1] >= yi and points[j] != points[i] for j in finite
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _series(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in sorted(rows, key=lambda r: r["concurrency"]):
        out.setdefault(r["config"], []).append(r)
    return out


def _save(fig: Figure, ax: Axes, title: str, path: Path) -> None:
    plt = _pyplot()
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_pareto(rows: list[Row], title: str, path: Path) -> None:
    fig, ax = _pyplot().subplots(figsize=(7, 5))
    for name, rs in _series(rows).items():
        xs = [r["tok_s_per_user"] for r in rs]
        ys = [r["output_tok_s_per_gpu"] for r in rs]
        ax.plot(xs, ys, marker="o", label=name)
        for r, x, y in zip(rs, xs, ys, strict=True):
            ax.annotate(str(r["concurrency"]), (x, y), textcoords="offset points", xytext=(4, 4))
    points = [(r["tok_s_per_user"], r["output_tok_s_per_gpu"]) for r in rows]
    front = pareto_front(points)
    if front:
        ax.plot(
            [points[i][0] for i in front],
            [points[i][1] for i in front],
            linestyle="--",
            color="black",
            marker="s",
            markerfacecolor="none",
            markersize=11,
            label="Pareto front",
        )
    ax.set_xlabel("tok/s per user (1000 / mean TPOT ms)")
    ax.set_ylabel("output tok/s per GPU")
    _save(fig, ax, title, path)


def plot_latency(rows: list[Row], key: str, label: str, title: str, path: Path) -> None:
    fig, ax = _pyplot().subplots(figsize=(7, 5))
    for name, rs in _series(rows).items():
        ax.plot([r["concurrency"] for r in rs], [r[key] for r in rs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel(label)
    _save(fig, ax, title, path)


def draw_all(rows: list[Row], grid_name: str, out: Path) -> list[Path]:
    """Three PNGs per (ISL, OSL) pair in `out`; returns their paths."""
    paths: list[Path] = []
    for isl, osl in sorted({(r["isl"], r["osl"]) for r in rows}):
        rs = [r for r in rows if (r["isl"], r["osl"]) == (isl, osl)]
        tag = f"isl{isl}-osl{osl}"
        where = f"{grid_name}, ISL {isl} / OSL {osl}"
        pareto = out / f"pareto-{tag}.png"
        plot_pareto(rs, f"Throughput per GPU vs per user ({where})", pareto)
        ttft = out / f"ttft-{tag}.png"
        plot_latency(rs, "ttft_ms_p50", "TTFT p50 (ms)", f"TTFT vs concurrency ({where})", ttft)
        itl = out / f"itl-{tag}.png"
        plot_latency(rs, "itl_ms_p50", "ITL p50 (ms)", f"ITL vs concurrency ({where})", itl)
        paths += [pareto, ttft, itl]
    return paths


COLUMNS = (
    "config", "concurrency", "isl", "osl", "completed", "failed", "output_throughput",
    "output_tok_s_per_gpu", "tok_s_per_user", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50",
    "itl_ms_p99",
)  # fmt: skip


def _cell(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else html.escape(str(value))


def write_index(rows: list[Row], plots: list[Path], meta: dict[str, Any], out: Path) -> Path:
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in COLUMNS) + "</tr>" for r in rows
    )
    images = "".join(f'<p><img src="{p.name}" alt="{p.stem}"></p>' for p in plots)
    info = "".join(f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in meta.items())
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(meta['grid'])}"
        f"</title></head><body><h1>Sweep {html.escape(meta['grid'])}</h1><ul>{info}</ul>"
        f"{images}<h2>Points</h2><p><a href='summary.csv'>summary.csv</a>; one JSON per point "
        f"under points/.</p><table border='1'><tr>{head}</tr>{body}</table></body></html>"
    )
    path = out / "index.html"
    path.write_text(page)
    return path

"""bench sweep: grid parsing, the Pareto front, AIPerf's export mapping, and one real tiny sweep."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sweep import main as sweep_main
from bench.sweep import point_name
from bench.sweep_grid import GridError, load_grid, parse_grid
from bench.sweep_loadgen import aiperf_command, read_aiperf
from bench.sweep_plots import pareto_front

GRID = {
    "name": "g",
    "concurrency": [1, 4],
    "isl_osl": [[64, 16], [256, 8]],
    "configs": [
        {"name": "agg", "serve_args": "--max-batch-size 8"},
        {"name": "pd", "prefill_args": [], "decode_args": ["--max-local-prefill-tokens", 0]},
        {"name": "peer", "url": "http://127.0.0.1:9"},
    ],
}


def test_grid_kinds_gpus_and_points() -> None:
    grid = parse_grid(GRID)
    agg, pd, peer = grid.configs
    assert (agg.kind, agg.serve_args, agg.gpus) == ("aggregated", ("--max-batch-size", "8"), 1)
    assert (pd.kind, pd.decode_args, pd.gpus) == (
        "disaggregated",
        ("--max-local-prefill-tokens", "0"),
        2,
    )
    assert (peer.kind, peer.url) == ("url", "http://127.0.0.1:9")
    points = grid.points()
    assert len(points) == 3 * 2 * 2
    assert points[0] == (agg, 1, 64, 16)  # configs outermost: one server start each
    assert grid.num_requests(1) == 8 and grid.num_requests(4) == 16
    assert point_name(pd, 4, 64, 16) == "pd-isl64-osl16-c4.json"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"configs": []}, "configs"),
        ({"concurrency": [0]}, "concurrency"),
        ({"isl_osl": [[1]]}, "isl_osl"),
        ({"configs": [{"name": "a", "bogus": 1}]}, "unknown keys"),
        ({"configs": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"configs": [{"name": "a", "url": "http://x", "serve_args": []}]}, "url"),
        ({"configs": [{"name": "a", "gpus": 0}]}, "gpus"),
    ],
)
def test_grid_errors_name_the_key(patch: dict[str, object], message: str) -> None:
    with pytest.raises(GridError, match=message):
        parse_grid({**GRID, **patch})


def test_shipped_cpu_grid_parses() -> None:
    grid = load_grid(Path("bench/sweep_cpu.yaml"))
    assert [c.kind for c in grid.configs] == ["aggregated", "disaggregated"]
    assert grid.concurrency == (1, 2, 4, 8, 16, 32)


def test_pareto_front() -> None:
    points = [(10.0, 100.0), (20.0, 80.0), (15.0, 70.0), (30.0, 20.0), (5.0, 90.0)]
    # (15, 70) loses to (20, 80); (5, 90) loses to (10, 100).
    assert pareto_front(points) == [0, 1, 3]
    assert pareto_front([(1.0, float("nan")), (1.0, 1.0)]) == [1]


def test_aiperf_export_mapping() -> None:
    doc = {
        "request_throughput": {"unit": "requests/sec", "avg": 2.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 256.0},
        "time_to_first_token": {"unit": "ms", "avg": 50.0, "p50": 40.0, "p99": 90.0},
        "inter_token_latency": {"unit": "ms", "avg": 20.0, "p50": 19.0, "p99": 30.0},
        "request_latency": {"unit": "ms", "avg": 700.0},
        "request_count": {"unit": "requests", "avg": 16.0},
        "benchmark_duration": {"unit": "sec", "avg": 8.0},
        "error_summary": [{"error_details": {"code": 500, "message": "boom"}, "count": 2}],
    }
    r = read_aiperf(doc)
    assert r["output_throughput"] == 256.0 and r["completed"] == 16 and r["failed"] == 2
    assert (r["ttft_ms_p50"], r["itl_ms_p99"], r["e2el_ms_mean"]) == (40.0, 30.0, 700.0)
    assert r["tok_s_per_user"] == pytest.approx(50.0)  # 1000 / 20 ms
    assert r["errors"] == ["boom"]
    cmd = aiperf_command("http://h:1", "m", 8, 128, 64, 32, Path("/tmp/a"), "/tok")
    assert cmd[:2] == ["aiperf", "profile"]
    assert cmd[cmd.index("--concurrency") + 1] == "8"
    assert cmd[cmd.index("--isl") + 1] == "128"
    assert cmd[cmd.index("--output-tokens-mean") + 1] == "64"
    assert cmd[cmd.index("--tokenizer") + 1] == "/tok"


@pytest.mark.e2e
def test_tiny_sweep_on_the_real_model(tmp_path: Path) -> None:
    """Starts the built-in engine on SmolLM2, runs two concurrencies, writes every artifact."""
    grid = {
        "name": "tiny",
        "serve_args": ["--device", "cpu", "--num-kv-blocks", "256", "--log-level", "warning"],
        "concurrency": [1, 2],
        "isl_osl": [[40, 4]],  # two full blocks a prompt: a repeated prompt would hit 32 tokens
        "requests_per_concurrency": 1,
        "min_requests": 2,
        "warmup": 1,
        "configs": [{"name": "aggregated"}],
    }
    (tmp_path / "grid.yaml").write_text(json.dumps(grid))  # JSON is YAML
    out = tmp_path / "out"
    assert sweep_main(["--grid", str(tmp_path / "grid.yaml"), "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["config"], r["concurrency"]) for r in rows] == [
        ("aggregated", "1"),
        ("aggregated", "2"),
    ]
    for r in rows:
        assert r["completed"] == "2" and r["failed"] == "0"
        assert float(r["output_throughput"]) > 0 and float(r["tok_s_per_user"]) > 0
        # Each point's prompts are its own (with one seed for all, c=2 hit c=1's: checked).
        assert float(r["prefix_cache_hit_tokens"]) == 0
    point = json.loads((out / "points" / "aggregated-isl40-osl4-c2.json").read_text())
    assert point["num_requests"] == 2 and point["osl"] == 4
    for name in ("pareto-isl40-osl4.png", "ttft-isl40-osl4.png", "itl-isl40-osl4.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (out / "index.html").read_text()
    assert "pareto-isl40-osl4.png" in index and "summary.csv" in index
    # --plots-only redraws from the points without a server.
    (out / "index.html").unlink()
    assert (
        sweep_main(["--grid", str(tmp_path / "grid.yaml"), "--out", str(out), "--plots-only"]) == 0
    )
    assert (out / "index.html").exists()


def test_cli_bench_sweep_from_the_console_script() -> None:
    """`trtllm-gateway bench sweep` finds bench/ in the repository root (not on sys.path)."""
    script = Path(sys.executable).with_name("trtllm-gateway")
    assert script.exists(), "make install puts the trtllm-gateway script beside the interpreter"
    out = subprocess.run(
        [str(script), "bench", "sweep", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "--grid" in out.stdout and "--loadgen" in out.stdout


def test_a_disaggregated_config_gives_both_siblings_one_internal_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a shared --internal-api-key the prefill sibling's endpoints answer 403 and the
    decode instance prefills every prompt itself: the sweep would measure aggregated serving."""
    from bench import sweep_servers

    started: list[list[str]] = []

    class Recorded:
        def __init__(self, name: str, args: list[str], gpu: str, log_dir: Path) -> None:
            started.append(args)
            self.url = f"http://127.0.0.1:{9000 + len(started)}"

        def ready(self) -> Recorded:
            return self

        def stop(self) -> None:
            pass

    monkeypatch.setattr(sweep_servers, "Instance", Recorded)
    grid = parse_grid(
        {
            "name": "g",
            "concurrency": [1],
            "isl_osl": [[40, 4]],  # two full blocks a prompt: a repeated prompt would hit 32 tokens
            "configs": [{"name": "pd", "prefill_args": [], "decode_args": []}],
        }
    )
    with sweep_servers.serving(grid.configs[0], ("--device", "cpu"), tmp_path):
        pass
    keys = [a[a.index("--internal-api-key") + 1] for a in started]
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) >= 16

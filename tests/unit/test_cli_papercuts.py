"""Small CLI and Makefile behaviours users hit first: config show per engine, bench sweep's usage
line, `make serve PORT=`, `make bench` leaving the tracked docs alone."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtllm_gateway.app.cli import main
from trtllm_gateway.config.check import BUILTIN_FIELDS, main_show

ROOT = Path(__file__).resolve().parents[2]


def test_config_show_builtin_prints_the_builtin_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main_show(["--engine", "builtin", "--max-batch-size", "8", "--block-size", "32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# --engine builtin\n")
    shown = yaml.safe_load(out)
    assert set(shown) == set(BUILTIN_FIELDS)
    assert shown["max_batch_size"] == 8 and shown["block_size"] == 32
    assert "cache_transceiver_config" not in out and "backend" not in shown
    assert main_show(["--engine", "trtllm", "--model", "/m"]) == 0  # TensorRT-LLM: its LLM args
    assert "backend: pytorch" in capsys.readouterr().out


def test_bench_sweep_help_names_the_command() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "trtllm_gateway", "bench", "sweep", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert r.stdout.startswith("usage: trtllm-gateway bench sweep ")


@pytest.mark.parametrize(
    ("make_args", "port"), [([], "8000"), (["PORT=9123"], "9123"), (["PORT=0"], "0")]
)
def test_make_serve_port(make_args: list[str], port: str) -> None:
    """`make -n` prints the serve command line without running anything: one --port, PORT's."""
    r = subprocess.run(
        ["make", "-n", "-o", "model", "serve", *make_args, "ARGS=--max-batch-size 8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    line = next(x for x in r.stdout.splitlines() if "trtllm-gateway serve" in x)
    args = line.split()
    assert args.count("--port") == 1 and args[args.index("--port") + 1] == port
    assert "--max-batch-size" in args


@pytest.mark.parametrize(
    ("flags", "rc", "says"),
    [
        (["--logits-processor", "nope.mod:X"], 1, "cannot import nope.mod"),
        (["--logits-processor", "trtllm_gateway.app.cli:main"], 1, "not a subclass"),
        (["--otlp-traces-endpoint", "collector:4318"], 2, "is not an http(s) URL"),
    ],
)
def test_bad_extension_flags_refuse_to_start(
    flags: list[str], rc: int, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked in the gateway process before the engine starts (the built-in core would
    otherwise die loading while the server stays up answering 503)."""
    assert main(["serve", "--port", "0", *flags]) == rc
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_make_bench_writes_results_elsewhere(tmp_path: Path) -> None:
    """bench.run's default output is bench-results/, a copy of docs/benchmarks.md with the new
    sections; the tracked file changes only with --doc docs/benchmarks.md."""
    doc = ROOT / "docs" / "benchmarks.md"
    before = hashlib.sha256(doc.read_bytes()).hexdigest()
    summary = tmp_path / "gpu.md"
    summary.write_text("GPU SUMMARY MARKER\n")
    out = tmp_path / "work"
    out.mkdir()
    (out / "docs").mkdir()
    (out / "docs" / "benchmarks.md").write_bytes(doc.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "bench.run", "--skip-cpu", "--gpu-summary", str(summary)],
        cwd=out,
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    )
    written = (out / "bench-results" / "benchmarks.md").read_text()
    assert "GPU SUMMARY MARKER" in written
    assert (out / "docs" / "benchmarks.md").read_bytes() == doc.read_bytes()
    assert hashlib.sha256(doc.read_bytes()).hexdigest() == before

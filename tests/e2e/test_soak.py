"""A short soak in the suite (issue 24): bench.soak, the bounded soak `make soak` runs with
10,000 requests, here with 200 at concurrency 16 and 20% client cancels, against its own server
on the real default model. Nothing may leak: no 5xx or transport error, no KV block or request
left in the engine, descriptors back to their count, and after the SIGTERM an exit 0 with no
process, ipc:// socket directory or /dev/shm segment left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.server import ROOT


def test_a_short_soak_with_cancels_leaks_nothing(log_dir: Path) -> None:
    cmd = [
        *(sys.executable, "-m", "bench.soak"),
        *("--requests", "200", "--concurrency", "16", "--max-tokens", "8"),
        *("--", "--num-kv-blocks", "256"),
    ]
    env = {**os.environ, "SOAK_LOG": str(log_dir / "soak-server.log")}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.stdout.strip(), run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["passed"], summary
    assert summary["client_cancelled"] > 0 and summary["completed"] > 0, summary
    assert (summary["server_errors"], summary["transport_errors"]) == (0, 0), summary
    assert summary["idle_after"]["kv_cache_usage_perc"] == 0, summary
    assert summary["server_exit_code"] == 0, summary
    left = (summary["processes_left"], summary["socket_dirs_left"], summary["shm_left"])
    assert left == ([], [], []), summary
    assert run.returncode == 0

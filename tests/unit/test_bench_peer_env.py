"""bench.run's race: the peer server starts from the shell's environment less the project's.

Issue 36: bench.run gave llama.cpp's server its own os.environ, which held the
OMP_WAIT_POLICY=PASSIVE that importing the package had put there, and that server ran about 3x
slower at concurrency 1 for it. These start bench.run's real peer (a stand-in binary that dumps
its environment) from a process that imported bench and loaded the engine, as bench.run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# bench.run's process: bench (its SHELL_ENV snapshot), the engine loaded (torch under the
# engine's OpenMP policy), then the peer started as cpu_suite starts it.
DRIVER = """
import sys
from bench import run
import trtllm_gateway.engine.builtin.core  # noqa: F401
peer = run.servers(run.parser().parse_args(["--llama-server", sys.argv[1]]))[1]
peer.start()
sys.exit(peer.proc.wait())
"""


def _peer_env(tmp_path: Path, shell: dict[str, str]) -> dict[str, str]:
    dump = tmp_path / "env.json"
    fake = tmp_path / "llama-server"
    dump_env = f"import json, os\njson.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n"
    fake.write_text(f"#!{sys.executable}\n{dump_env}")
    fake.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(fake)], env=shell, cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    env: dict[str, str] = json.loads(dump.read_text())
    return env


def _shell(**extra: str) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "XDG_CACHE_HOME", "TMPDIR")
    shell = {k: os.environ[k] for k in keep if k in os.environ}
    return shell | {"PYTHONPATH": str(ROOT)} | extra


def test_the_peer_gets_none_of_the_projects_variables(tmp_path: Path) -> None:
    shell = _shell(
        GATEWAY_CPU_ISA="avx2", GATEWAY_API_KEY="k", MALLOC_ARENA_MAX="2",
        GOMP_SPINCOUNT="1000", LLAMA_ARG_THREADS_HTTP="4", USER_THING="x",
    )  # fmt: skip
    env = _peer_env(tmp_path, shell)
    ours = sorted(k for k in env if k.startswith(("GATEWAY_", "OMP_", "GOMP_", "KMP_", "MALLOC_")))
    assert ours == []
    # The rest of the shell's environment is the peer's, its own variables included.
    assert env["USER_THING"] == "x"
    assert env["LLAMA_ARG_THREADS_HTTP"] == "4"
    assert env["PATH"] == shell["PATH"]


def test_the_peer_does_not_get_a_wait_policy_set_for_the_gateway(tmp_path: Path) -> None:
    """A user who sets OMP_WAIT_POLICY for the gateway's run sets it for the gateway only."""
    env = _peer_env(tmp_path, _shell(OMP_WAIT_POLICY="ACTIVE"))
    assert "OMP_WAIT_POLICY" not in env


def test_differences_name_what_the_peer_lost_and_gained() -> None:
    from bench.peer_env import differences, peer_env

    shell = {"A": "1", "GATEWAY_CPU_ISA": "avx2", "OMP_WAIT_POLICY": "PASSIVE", "B": "2"}
    env = peer_env(shell)
    assert env == {"A": "1", "B": "2"}
    assert differences(env | {"C": "3", "B": "4"}, shell) == [
        "-GATEWAY_CPU_ISA=avx2",
        "-OMP_WAIT_POLICY=PASSIVE",
        "+C=3",
        "~B=4 (shell: 2)",
    ]


@pytest.mark.parametrize("module", ["trtllm_gateway", "trtllm_gateway.app.main", "bench.run"])
def test_importing_leaves_the_environment_as_it_was(module: str) -> None:
    code = (
        f"import os; before = dict(os.environ); import {module}; print(dict(os.environ) == before)"
    )
    env = _shell()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.stdout.strip() == "True", out.stderr[-2000:]

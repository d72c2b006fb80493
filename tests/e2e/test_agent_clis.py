"""Codex CLI (`codex exec`), unmodified, completing one turn against a live gateway on the real
default model through /v1/responses (a provider whose wire_api is "responses").

It is an npm package, not a Python one: `make clients` installs it under .agent-clis/ (or
`npm i -g @openai/codex`, or `--prefix DIR` and AGENT_CLIS_BIN=DIR/bin). Without it this test
skips, saying so, except where REQUIRE_AGENT_CLIS is set (CI's .ci/run sets it): there it fails.

Claude Code (`claude -p` with ANTHROPIC_BASE_URL, 2.1.197) has no test here: its requests and
streams are served and parsed (it retries after each max_tokens), but whether SmolLM2-135M ends
a turn is luck. Claude Code sends no temperature (1.0 here), and -p calls a reply that reaches
its output cap an error: with `--bare --system-prompt "You are a helpful assistant." --tools ""`
it finished 3 of 5 runs (rc 0, 82-token answers); with its own ~3,000-token system prompt and
tools, never (caps of 40, 200, 600 and 4,000 tokens, and the clamped 5,150: 398 s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.server import Server

MODEL = "SmolLM2-135M-Instruct"


LOCAL = Path(__file__).resolve().parents[2] / ".agent-clis" / "node_modules" / ".bin"


def cli(name: str) -> str:
    where = os.environ.get("AGENT_CLIS_BIN") or (str(LOCAL) if LOCAL.is_dir() else None)
    found = shutil.which(name, path=where) if where else shutil.which(name)
    if found is None:
        why = f"`{name}` is not installed (make clients, or npm i -g @openai/codex)"
        if os.environ.get("REQUIRE_AGENT_CLIS"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def served(server: Server, path: str) -> list[str]:
    assert server.log_path is not None
    return [
        line
        for line in server.log_path.read_text(errors="replace").splitlines()
        if "trtllm_gateway.access" in line and f'"path": "{path}"' in line
    ]


def test_codex_exec_completes_a_turn(server: Server, tmp_path: Path) -> None:
    codex = cli("codex")
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "gateway"\n\n'
        "[model_providers.gateway]\n"
        'name = "trtllm-gateway"\n'
        f'base_url = "{server.url}/v1"\n'
        'wire_api = "responses"\n'
    )
    before = len(served(server, "/v1/responses"))
    done = subprocess.run(
        [codex, "exec", "--skip-git-repo-check", "What is the capital of France?"],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()  # the model's answer, whatever a 135M model makes of it
    calls = served(server, "/v1/responses")[before:]
    assert calls and all('"status": 200' in line for line in calls), calls

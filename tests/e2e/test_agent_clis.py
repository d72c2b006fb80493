"""Claude Code (`claude -p`) and Codex CLI (`codex exec`), unmodified, each completing one turn
against a live gateway on the real default model: Claude Code through /v1/messages
(ANTHROPIC_BASE_URL), Codex through /v1/responses (a provider whose wire_api is "responses").

They are npm packages, not Python ones: `npm i -g @anthropic-ai/claude-code @openai/codex` (or
`--prefix DIR` and AGENT_CLIS_BIN=DIR/bin). Without them these tests skip, saying so.

Claude Code runs with --bare, a one-line --system-prompt and no tools: with its own ~3,000-token
system prompt and tools, SmolLM2-135M never ended a turn within any output cap tried (40, 200,
600 and the clamped 5,150 tokens: 398 s), and Claude Code in -p mode treats max_tokens as an
error. The requests and streams themselves were served and parsed in both settings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.server import Server

MODEL = "SmolLM2-135M-Instruct"


def cli(name: str) -> str:
    where = os.environ.get("AGENT_CLIS_BIN")
    found = shutil.which(name, path=where) if where else shutil.which(name)
    if found is None:
        pytest.skip(f"`{name}` is not installed (npm i -g @anthropic-ai/claude-code @openai/codex)")
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


def test_claude_code_print_completes_a_turn(server: Server, tmp_path: Path) -> None:
    claude = cli("claude")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "unused",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1000",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }
    before = len(served(server, "/v1/messages"))
    args = ["-p", "What is the capital of France?", "--model", MODEL, "--bare"]
    args += ["--system-prompt", "You are a helpful assistant.", "--tools", ""]
    done = subprocess.run(
        [claude, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.strip()
    calls = served(server, "/v1/messages")[before:]
    assert calls and all('"status": 200' in line for line in calls), calls

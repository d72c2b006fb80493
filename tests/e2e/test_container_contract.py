"""What the Dockerfile promises, checked where no Docker engine runs: both targets run as a
non-root user, start the gateway through `python -m trtllm_gateway serve`, and their HEALTHCHECK
command
really passes against a ready server (and fails against a port nobody serves)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.e2e.server import ROOT, Server, free_port

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _targets() -> dict[str, str]:
    parts = re.split(r"^FROM .* AS (\w+)\s*$", DOCKERFILE, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _instruction(body: str, name: str) -> str:
    joined = body.replace("\\\n", " ")
    found = re.findall(rf"^{name}\s+(.*)$", joined, flags=re.M)
    assert found, f"no {name} in target"
    return found[-1].strip()


@pytest.mark.parametrize("target", ["trtllm", "builtin"])
def test_target_runs_non_root_and_serves(target: str) -> None:
    body = _targets()[target]
    assert _instruction(body, "USER") not in ("root", "0")
    cmd = json.loads(_instruction(body, "CMD"))
    assert cmd[1:4] == ["-m", "trtllm_gateway", "serve"]
    if target == "trtllm":
        assert cmd[cmd.index("--engine") + 1] == "trtllm"


@pytest.mark.parametrize("target", ["trtllm", "builtin"])
def test_healthcheck_command_passes_when_ready(target: str, server: Server) -> None:
    check = _instruction(_targets()[target], "HEALTHCHECK")
    command = check.split(" CMD ", 1)[1]
    argv = command.split(" ", 2)  # python -c "..."
    script = argv[2].strip().strip('"')
    env = {**os.environ, "GATEWAY_PORT": str(server.port)}
    ok = subprocess.run([sys.executable, "-c", script], env=env, timeout=30)
    assert ok.returncode == 0
    env["GATEWAY_PORT"] = str(free_port())
    down = subprocess.run([sys.executable, "-c", script], env=env, timeout=30, capture_output=True)
    assert down.returncode != 0

"""A real gateway process on loopback for e2e tests: start, wait for /health, scrape, stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
# The first server that did not become ready in time: later starts fail at once with its story
# instead of each waiting out its own timeout on a machine that cannot start servers.
_STALLED: str | None = None


class ServerStartError(RuntimeError):
    """A gateway process exited or did not become ready; the message ends with its log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path, ready_timeout: float = 180.0, wait: bool = True) -> Server:
        if _STALLED is not None:
            raise ServerStartError(f"not started: an earlier e2e server stalled.\n{_STALLED}")
        self.log_path = log_dir / f"server-{self.port}.log"
        cmd = [
            sys.executable,
            "-m",
            "trtllm_gateway",
            "serve",
            "--port",
            str(self.port),
            *self.args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
        if wait:
            self.wait_ready(ready_timeout)
        return self

    def wait_ready(self, timeout: float = 180.0) -> None:
        global _STALLED
        deadline = time.monotonic() + timeout
        health = "no answer"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerStartError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200:
                    return
                health = r.text[:300]
            except httpx.HTTPError as e:
                health = repr(e)
            time.sleep(0.2)
        self.kill()
        _STALLED = f"server not ready in {timeout}s (/health: {health}); its log:\n{self.log()}"
        raise ServerStartError(_STALLED)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path else ""

    def metric(self, name: str, labels: str = "") -> float:
        """Sum of a Prometheus sample (optionally filtered by a label substring)."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        total, found = 0.0, False
        for line in text.splitlines():
            m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.eE+-]+|NaN)$", line)
            if m and labels in (m.group(1) or ""):
                total += float(m.group(2))
                found = True
        if not found:
            raise KeyError(f"{name} not in /metrics")
        return total

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

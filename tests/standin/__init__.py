"""Helpers to run tests and servers over the stand-in `tensorrt_llm` package in this folder.

The package is never importable by default: a test that needs it calls `use_standin(monkeypatch)`
(in-process) or launches the server with `standin_env()` (subprocess, PYTHONPATH=tests/standin).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

STANDIN_DIR = Path(__file__).resolve().parent


def standin_env(base: dict[str, str] | None = None, step_delay_s: float = 0.0) -> dict[str, str]:
    """Environment for `python -m trtllm_gateway serve --engine trtllm ...` over the stand-in."""
    env = dict(os.environ if base is None else base)
    parts = [str(STANDIN_DIR), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    env["TRTLLM_STANDIN_STEP_DELAY_S"] = str(step_delay_s)
    return env


def ensure_on_path() -> None:
    """Make `import tensorrt_llm` resolve to the stand-in for the rest of this process."""
    if str(STANDIN_DIR) not in sys.path:
        sys.path.insert(0, str(STANDIN_DIR))

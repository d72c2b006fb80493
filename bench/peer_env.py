"""The environment a peer server (llama.cpp's) starts with: the shell's, less the project's.

A peer runs as its own users run it: from the environment the benchmark was started with
(bench.SHELL_ENV, taken before anything of ours ran), less every variable that is ours or that
tunes the gateway's own process: GATEWAY_*, the OpenMP and allocator knobs (OMP_*, GOMP_*,
KMP_*, MALLOC_*). Why: bench.run once passed its os.environ on, with the OMP_WAIT_POLICY=PASSIVE
that importing the package had put there, and llama.cpp's server (OpenMP too) ran about 3x
slower at concurrency 1 for it (issue 36: 28.5-29.7 tok/s against 86.3-86.8 in a clean one).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import bench

OURS_PREFIXES = ("GATEWAY_", "TRTLLM_GATEWAY_", "OMP_", "GOMP_", "KMP_", "MALLOC_")


def is_ours(name: str) -> bool:
    return name.startswith(OURS_PREFIXES)


def peer_env(shell: Mapping[str, str] | None = None) -> dict[str, str]:
    """The shell's environment (default bench.SHELL_ENV) without the project's variables."""
    shell = bench.SHELL_ENV if shell is None else shell
    return {k: v for k, v in shell.items() if not is_ours(k)}


def differences(env: Mapping[str, str], shell: Mapping[str, str] | None = None) -> list[str]:
    """How `env` differs from the shell's, one 'NAME: change' line each (printed at start)."""
    shell = bench.SHELL_ENV if shell is None else shell
    lines = [f"-{k}={shell[k]}" for k in sorted(shell.keys() - env.keys())]
    lines += [f"+{k}={env[k]}" for k in sorted(env.keys() - shell.keys())]
    lines += [f"~{k}={env[k]} (shell: {shell[k]})" for k in sorted(env.keys() & shell.keys())
              if env[k] != shell[k]]  # fmt: skip
    return lines


def added_since_start() -> list[str]:
    """What this process's os.environ holds that the shell's did not (should be nothing)."""
    return differences(dict(os.environ))

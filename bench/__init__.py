"""Benchmarks: offline engine (bench.offline), OpenAI serving (bench.serve), make bench (run)."""

import os

# The environment this benchmark was started with, before anything of ours ran: a peer server
# (llama.cpp's) starts from this, less the project's variables (bench/peer_env.py).
SHELL_ENV = dict(os.environ)

# Load torch under the engine's OpenMP policy (engine/builtin/openmp_env.py) before any benchmark
# imports it itself, so the kernel and step benchmarks time the server's OpenMP waiting; the
# policy is given to torch as it loads and is not left in os.environ.
from trtllm_gateway.engine.builtin import openmp_env  # noqa: E402, F401

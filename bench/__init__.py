"""Benchmarks: offline engine (bench.offline), OpenAI serving (bench.serve), make bench (run)."""

import os

# The environment this benchmark was started with, before anything of ours ran: a peer server
# (llama.cpp's) starts from this, less the project's variables (bench/peer_env.py).
SHELL_ENV = dict(os.environ)

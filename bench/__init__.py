"""Benchmarks: offline engine (bench.offline), OpenAI serving (bench.serve), make bench (run)."""

# The package sets OMP_WAIT_POLICY=PASSIVE, which libgomp reads once, when torch loads it: first,
# so the kernel benchmarks that import torch themselves time the server's OpenMP waiting, not
# libgomp's spinning (under load 3-4 a spinning 2-thread call took 8 ms instead of 0.2-1 ms).
import trtllm_gateway  # noqa: F401

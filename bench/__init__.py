"""Benchmarks: offline engine (bench.offline), OpenAI-API serving (bench.serve), make bench (bench.run)."""

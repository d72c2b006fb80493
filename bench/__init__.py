"""Benchmarks: offline engine (bench.offline), OpenAI serving (bench.serve), make bench (run)."""

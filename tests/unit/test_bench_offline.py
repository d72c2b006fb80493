"""bench.offline's concurrency levels each get prompts of their own: run again, the level
before's prompts would be prefix-cache hits (an H200's 1.9M-token e4m3 cache kept all 768 of
them, and a 512-running level read 19.5k tok/s where its fresh prompts' step allows ~14k)."""

from __future__ import annotations

import asyncio
import shlex

import pytest

from bench.offline import main_async, parser


def test_each_concurrency_level_prefills_fresh_prompts() -> None:
    args = parser().parse_args(
        shlex.split(
            "--model trtllm_gateway/config/models/smollm2-135m.json --load-format dummy "
            "--device cpu --num-prompts 3 --input-len 48 --output-len 2 --concurrency 3 3 "
            "--max-batch-size 4 --num-kv-blocks 64 --warmup 0"
        )
    )
    report = asyncio.run(main_async(args))
    assert [r["num_prompts"] for r in report["runs"]] == [3, 3]
    # 48-token prompts: with the first level's prompts again, 96 tokens hit (checked).
    assert [r["prefix_cache_hits"] for r in report["runs"]] == [0, 0]


def test_a_core_in_its_own_process_is_timed_and_sampled_from_outside() -> None:
    """--core process: the core runs as `serve` runs it (its own process); the client's cap
    comes from --fit-batch (64 blocks of 16 hold 14 sequences of 48 + 8 + a block), and the
    core's main thread is found and its CPU time read."""
    args = parser().parse_args(
        shlex.split(
            "--model trtllm_gateway/config/models/smollm2-135m.json --load-format dummy "
            "--device cpu --num-prompts 20 --input-len 48 --output-len 8 --concurrency 0 "
            "--max-batch-size 32 --num-kv-blocks 64 --warmup 0 --fit-batch --core process"
        )
    )
    report = asyncio.run(main_async(args))
    assert report["core"] == "process" and report["kv_tokens"] == 64 * 16
    assert report["max_running"] == 64 * 16 // (48 + 8 + 16)
    (run,) = report["runs"]
    assert run["concurrency"] == report["max_running"] and run["output_tokens"] == 20 * 8
    assert run["core_thread_cpu_pct"] > 0  # the child's main thread, sampled
    assert "device" not in report  # nothing read from the core's objects


def test_a_process_core_refuses_what_needs_its_objects() -> None:
    args = parser().parse_args(
        shlex.split(
            "--model trtllm_gateway/config/models/smollm2-135m.json --decode-latency --core process"
        )
    )
    with pytest.raises(SystemExit, match="need --core thread"):
        asyncio.run(main_async(args))

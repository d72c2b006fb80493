"""bench.offline's concurrency levels each get prompts of their own: run again, the level
before's prompts would be prefix-cache hits (an H200's 1.9M-token e4m3 cache kept all 768 of
them, and a 512-running level read 19.5k tok/s where its fresh prompts' step allows ~14k)."""

from __future__ import annotations

import asyncio
import shlex

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

"""bench.profile_prefill on the CPU: each round's prompts are prefilled in one step and ended
(one token each), and a CPU report carries no kernel table."""

from __future__ import annotations

import shlex
import statistics

import pytest

from bench.profile_prefill import parser, profile


def test_a_round_is_one_prefill_step_of_fresh_prompts() -> None:
    args = parser().parse_args(
        shlex.split(
            "--model trtllm_gateway/config/models/smollm2-135m.json --load-format dummy "
            "--device cpu --prompts 2 --input-len 48 --rounds 2 --warmup-rounds 1 "
            "--num-kv-blocks 64 --max-batch-size 4"
        )
    )
    report = profile(args)
    assert report["tokens_a_round"] == 96
    assert report["steps_a_round"] == [1, 1]  # 96 prompt tokens fit one step; one token each
    assert len(report["round_ms"]) == 2 and report["prefill_tok_s"] > 0
    assert "gpu" not in report


def test_rounds_beside_running_decodes_are_mixed_steps() -> None:
    args = parser().parse_args(
        shlex.split(
            "--model trtllm_gateway/config/models/smollm2-135m.json --load-format dummy "
            "--device cpu --prompts 2 --input-len 48 --rounds 2 --warmup-rounds 1 "
            "--num-kv-blocks 64 --max-batch-size 8 --running 3 --warm-tokens 4 --output-len 64"
        )
    )
    report = profile(args)
    assert report["running"] == 3  # the decodes outlived the rounds
    assert report["steps_a_round"] == [1, 1]  # the round's prompts ended in their mixed step
    assert report["decode_step_ms"] > 0
    assert report["mixed_step_ms_est"] == pytest.approx(
        statistics.median(report["round_ms"]), abs=0.01
    )

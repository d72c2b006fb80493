"""Sequence.block_table_array: the cached int32 copy follows every change of block_table."""

from __future__ import annotations

import torch

from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams


def test_table_array_follows_growth_and_replacement() -> None:
    req = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=4))
    seq = Sequence.from_request(req, torch.Generator())
    assert seq.block_table_array().tolist() == []
    seq.block_table += [7, 9]  # the scheduler grows the list in place
    first = seq.block_table_array()
    assert first.tolist() == [7, 9] and str(first.dtype) == "int32"
    assert seq.block_table_array() is first  # unchanged list: no rebuild
    seq.block_table = [4, 5]  # replaced (preemption, prefix-cache hit): same length, new list
    assert seq.block_table_array().tolist() == [4, 5]
    seq.block_table += [6]
    assert seq.block_table_array().tolist() == [4, 5, 6]

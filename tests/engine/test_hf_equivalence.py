"""Greedy output of the built-in engine equals HF transformers generate on the same weights."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.conftest import EngineFactory, collect, greedy
from trtllm_gateway.engine.protocol import GenerateRequest

MAX_NEW = 24


@pytest.fixture(scope="module")
def hf_reference(
    model_dir: Path, chat_prompts: list[list[int]]
) -> list[tuple[list[int], list[float]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = []
    for ids in chat_prompts:
        res: Any = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=model.config.eos_token_id,
        )
        tokens = res.sequences[0, len(ids) :].tolist()
        lps = [
            float(torch.log_softmax(lg[0].float(), -1)[t])
            for lg, t in zip(res.logits, tokens, strict=True)
        ]
        out.append((tokens, lps))
    return out


def _check(events: list[Any], ref: tuple[list[int], list[float]]) -> None:
    tokens = [t for ev in events for t in ev.token_ids]
    lps = [lp.logprob for ev in events for lp in (ev.logprobs or ())]
    assert tokens == ref[0]
    assert len(lps) == len(tokens)
    for ours, theirs in zip(lps, ref[1], strict=True):
        assert abs(ours - theirs) < 1e-3


async def test_sequential_matches_hf(
    make_engine: EngineFactory, chat_prompts: list[list[int]], hf_reference: Any
) -> None:
    engine = await make_engine()
    for i, (ids, ref) in enumerate(zip(chat_prompts, hf_reference, strict=True)):
        req = GenerateRequest(f"seq-{i}", tuple(ids), greedy(MAX_NEW, logprobs=0))
        _check(await collect(engine, req), ref)


async def test_concurrent_batch_matches_hf(
    make_engine: EngineFactory, chat_prompts: list[list[int]], hf_reference: Any
) -> None:
    engine = await make_engine()
    reqs = [
        GenerateRequest(f"batch-{i}", tuple(ids), greedy(MAX_NEW, logprobs=0))
        for i, ids in enumerate(chat_prompts)
    ]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    for events, ref in zip(results, hf_reference, strict=True):
        _check(events, ref)


async def test_chunked_prefill_matches_hf(
    make_engine: EngineFactory, chat_prompts: list[list[int]], hf_reference: Any
) -> None:
    """A 16-token step budget splits every prompt into chunks; the output must not change."""
    engine = await make_engine(max_num_tokens=16, block_size=8)
    reqs = [
        GenerateRequest(f"chunk-{i}", tuple(ids), greedy(MAX_NEW, logprobs=0))
        for i, ids in enumerate(chat_prompts)
    ]
    results = await asyncio.gather(*(collect(engine, r) for r in reqs))
    for events, ref in zip(results, hf_reference, strict=True):
        _check(events, ref)

"""Issue 15: one request's bad sampling params never fail the other requests of its step.

Bad ids are refused at the engine's door (engine/builtin/sequence_builder.py) and never reach a
step; a row that fails inside the step (here its grammar matcher raising) fails alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.engine.conftest import EngineFactory, collect, greedy
from trtllm_gateway.engine.guided.matcher import RowMatcher
from trtllm_gateway.engine.protocol import (
    GenerateRequest,
    GuidedDecoding,
    InvalidRequestError,
    SamplingParams,
)
from trtllm_gateway.engine.transport.client import CoreClient

ATTACK = greedy(8, stop_token_ids=(-100000,), min_tokens=2)


def _tokens(events: list[Any]) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


async def _attack_with_victims(
    engine: CoreClient, prompts: list[tuple[int, ...]], attack_sp: SamplingParams = ATTACK
) -> list[Any]:
    attack = GenerateRequest("attack", prompts[0], attack_sp)
    victims = [GenerateRequest(f"v{i}", p, greedy(16)) for i, p in enumerate(prompts[1:4])]
    return await asyncio.gather(
        collect(engine, attack), *(collect(engine, v) for v in victims), return_exceptions=True
    )


async def test_out_of_range_ids_refused_at_admission(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    prompts = [tuple(p) for p in chat_prompts[:4]]
    alone = [
        _tokens(await collect(engine, GenerateRequest(f"a{i}", p, greedy(16))))
        for i, p in enumerate(prompts[1:4])
    ]
    results = await _attack_with_victims(engine, prompts)
    assert isinstance(results[0], InvalidRequestError)
    assert results[0].param == "stop_token_ids"
    assert [_tokens(r) for r in results[1:]] == alone
    vocab = engine.info.vocab_size
    bad = [
        ("logit_bias", greedy(2, logit_bias=((vocab, 1.0),))),
        ("allowed_token_ids", greedy(2, allowed_token_ids=(-1,))),
        ("stop_token_ids", greedy(2, stop_token_ids=(vocab + 5,))),
        # Wider than the vocabulary: torch.topk in the forward pass failed the step and the
        # engine died (found by the sibling-endpoint fuzz, which skips the HTTP checks).
        ("prompt_logprobs", greedy(2, prompt_logprobs=1_000_000)),
        ("logprobs", greedy(2, logprobs=-1)),
    ]
    for param, sp in bad:
        with pytest.raises(InvalidRequestError) as exc:
            await collect(engine, GenerateRequest(param, prompts[0], sp))
        assert exc.value.param == param
    with pytest.raises(InvalidRequestError) as exc:
        await collect(engine, GenerateRequest("p", (1, vocab), greedy(2)))
    assert exc.value.param == "prompt"


async def test_sampling_failure_fails_only_its_own_request(
    make_engine: EngineFactory, chat_prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack's row raises in the sampler, in the victims' step (its grammar matcher,
    made to fail: the ids that used to stand in for it never pass the engine's door now)."""
    engine = await make_engine()
    prompts = [tuple(p) for p in chat_prompts[:4]]
    alone = [
        _tokens(await collect(engine, GenerateRequest(f"a{i}", p, greedy(16))))
        for i, p in enumerate(prompts[1:4])
    ]

    def sync(self: RowMatcher, token_ids: list[int], prompt_len: int) -> None:
        raise ValueError("injected matcher failure")

    monkeypatch.setattr(RowMatcher, "sync", sync)
    attack = greedy(8, guided=GuidedDecoding("regex", "[a-z ]+"))
    for _ in range(2):
        results = await _attack_with_victims(engine, prompts, attack)
        assert isinstance(results[0], InvalidRequestError)
        assert "sampling failed" in str(results[0]) and "injected" in str(results[0])
        assert [_tokens(r) for r in results[1:]] == alone
    assert engine.health().state == "ready"

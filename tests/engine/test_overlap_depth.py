"""One step path at both overlap depths: the full engine on CPU with the real default model.

Depth 1 is what a GPU runs (the host resolves step N while step N+1 is launched, placeholders
standing for the ids not yet on the host); depth 0 is the CPU's default. --overlap-depth 1 runs
the GPU's pipeline, packer and sampler contract here on the CPU backend, so CI runs the code a
GPU runs above the backend. Every test runs one workload on an engine of each depth and wants
the same events: greedy tokens and logprobs, a seeded draw, penalties (rows that read the
history resolve the step in flight first), stop tokens (the wasted token past a stop never
reaches the request), an abort mid-flight (the unresolved placeholder is not counted), and a row
whose sampling fails.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from tests.engine.conftest import EngineFactory, collect, greedy
from tests.in_thread import thread_core
from trtllm_gateway.engine.builtin.sampler import Draws
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.logits.processor import ExtraArgs, LogitsProcessor, Row
from trtllm_gateway.engine.protocol import (
    GenerateRequest,
    RequestFailedError,
    SamplingParams,
    TokenEvent,
)
from trtllm_gateway.engine.transport.client import CoreClient

HERE = "tests.engine.test_overlap_depth"


class Counting:
    """The engine's own backend, counting the placeholder ids it was given to resolve."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.depth = inner.depth
        self.takes_draws = inner.takes_draws
        self.kv_caches = inner.kv_caches
        self.placeholders = 0

    def forward(
        self, batch: StepBatch, prev: torch.Tensor | None, draws: Draws | None = None
    ) -> torch.Tensor:
        self.placeholders += int((batch.token_ids < 0).sum())
        out: torch.Tensor = self.inner.forward(batch, prev, draws)
        return out


class FailThirdStep(LogitsProcessor[list[int]]):
    """Raises at the third step of each request selecting it (vllm_xargs "fail_third")."""

    def new_state(self, prompt_token_ids: Sequence[int], args: ExtraArgs) -> list[int] | None:
        return [0] if "fail_third" in args else None

    def apply(self, logits: torch.Tensor, rows: Sequence[Row[list[int]]]) -> None:
        for row in rows:
            row.state[0] += 1
            if row.state[0] == 3:
                raise RuntimeError("the processor failed at its third step")


async def engines(
    make_engine: EngineFactory, **overrides: Any
) -> list[tuple[CoreClient, Counting]]:
    """An engine at depth 0 and one at depth 1, each backend counting placeholders."""
    out = []
    for depth in (0, 1):
        engine = await make_engine(overlap_depth=depth, **overrides)
        pipeline = thread_core(engine)._st.pipeline
        assert pipeline.depth == depth
        counting = Counting(pipeline.backend)
        pipeline.backend = counting  # before any request: the core thread is idle
        out.append((engine, counting))
    return out


def summary(events: list[TokenEvent]) -> dict[str, Any]:
    last = events[-1]
    assert last.usage is not None
    return {
        "tokens": [t for ev in events for t in ev.token_ids],
        "reason": last.finish_reason,
        "stop": last.stop_token_id,
        "completion_tokens": last.usage.completion_tokens,
        "prompt_tokens": last.usage.prompt_tokens,
    }


def logprobs(events: list[TokenEvent]) -> list[tuple[int, float]]:
    out = []
    for ev in events:
        for lp in ev.logprobs or ():
            out.append((lp.token_id, lp.logprob))
        for lp in ev.prompt_logprobs or ():
            out.append((lp.token_id, lp.logprob))
    return out


async def run(engine: CoreClient, reqs: list[GenerateRequest]) -> list[list[TokenEvent]]:
    return list(await asyncio.gather(*(collect(engine, r) for r in reqs)))


async def test_greedy_tokens_and_logprobs_are_the_same_at_both_depths(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    reqs = [
        GenerateRequest(f"r{i}", tuple(p), greedy(8 + 4 * i, ignore_eos=i % 2 == 0))
        for i, p in enumerate(chat_prompts)
    ]
    reqs.append(GenerateRequest("lp", tuple(chat_prompts[0]), greedy(10, logprobs=2)))
    reqs.append(GenerateRequest("plp", tuple(chat_prompts[1]), greedy(6, prompt_logprobs=1)))
    # A seeded draw: its generator is drawn from at launch, in the same order at either depth.
    seeded = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=5)
    reqs.append(GenerateRequest("seeded", tuple(chat_prompts[2]), seeded))
    got = []
    for depth, (engine, counting) in enumerate(await engines(make_engine)):
        events = await run(engine, reqs)
        got.append(([summary(e) for e in events], [logprobs(e) for e in events]))
        assert (counting.placeholders > 0) == (depth == 1)  # only depth 1 launches ahead
    (plain, plain_lps), (overlapped, overlapped_lps) = got
    assert overlapped == plain
    assert "length" in {s["reason"] for s in plain}
    for a, b in zip(plain_lps, overlapped_lps, strict=True):
        assert [t for t, _ in a] == [t for t, _ in b]
        assert all(math.isclose(x, y, abs_tol=1e-4) for (_, x), (_, y) in zip(a, b, strict=True))
    assert plain_lps[-3] and plain_lps[-2]  # logprobs and prompt logprobs were asked and given


async def test_penalties_resolve_the_step_in_flight_first(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    prompt = tuple(chat_prompts[3])
    penalized = [
        greedy(24, repetition_penalty=1.5),
        greedy(24, presence_penalty=1.5),
        greedy(24, frequency_penalty=1.5),
    ]
    reqs = [GenerateRequest(f"p{i}", prompt, sp) for i, sp in enumerate(penalized)]
    reqs.append(GenerateRequest("plain", prompt, greedy(24)))
    got = []
    for engine, _ in await engines(make_engine):
        got.append([summary(e) for e in await run(engine, reqs)])
    assert got[1] == got[0]
    plain = got[0][-1]["tokens"]
    assert all(s["tokens"] != plain for s in got[0][:-1]), "every penalty changed the reply"


async def test_a_stop_token_cuts_the_reply_the_same_way(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    built = await engines(make_engine)
    prompt = tuple(chat_prompts[2])
    free = summary(
        (await run(built[0][0], [GenerateRequest("f", prompt, greedy(16, ignore_eos=True))]))[0]
    )["tokens"]
    stop = free[6]
    cut = free.index(stop) + 1
    reqs = [
        GenerateRequest("stop", prompt, greedy(16, ignore_eos=True, stop_token_ids=(stop,))),
        GenerateRequest("other", tuple(chat_prompts[4]), greedy(16, ignore_eos=True)),
    ]
    got = [[summary(e) for e in await run(engine, reqs)] for engine, _ in built]
    assert got[1] == got[0]
    assert got[0][0]["tokens"] == free[:cut] and got[0][0]["reason"] == "stop"
    assert got[0][0]["stop"] == stop and got[0][0]["completion_tokens"] == cut


async def test_an_abort_mid_flight_counts_only_the_tokens_sent(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    other = GenerateRequest("other", tuple(chat_prompts[5]), greedy(20, ignore_eos=True))
    got = []
    for engine, _ in await engines(make_engine):
        alone = summary((await run(engine, [other]))[0])
        long = engine.generate(
            GenerateRequest("long", tuple(chat_prompts[0]), greedy(400, ignore_eos=True))
        )
        beside = asyncio.ensure_future(collect(engine, other))
        received = [await anext(long) for _ in range(5)]
        engine.abort("long")
        received += [ev async for ev in long]
        sent = [t for ev in received for t in ev.token_ids]
        final = received[-1]
        assert final.finish_reason == "abort" and final.usage is not None
        assert final.usage.completion_tokens == len(sent) < 400
        assert summary(await beside) == alone  # the abort took nothing from its batch-mate
        got.append(sent[:5])
    assert got[1] == got[0]


async def test_a_failing_sampling_row_fails_only_its_request(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    reqs = [
        GenerateRequest("bad", tuple(chat_prompts[0]), greedy(12, extra_args=(("fail_third", 1),))),
        *(GenerateRequest(f"ok{i}", tuple(p), greedy(12)) for i, p in enumerate(chat_prompts[1:4])),
    ]
    got = []
    for engine, _ in await engines(make_engine, logits_processor=[f"{HERE}:FailThirdStep"]):
        results = await asyncio.gather(*(collect(engine, r) for r in reqs), return_exceptions=True)
        bad, *ok = results
        assert isinstance(bad, RequestFailedError) and "third step" in str(bad)
        assert all(isinstance(r, list) for r in ok)
        got.append([summary(r) for r in ok if isinstance(r, list)])
        assert engine.health().state == "ready"
    assert got[1] == got[0]


@pytest.mark.parametrize("depth", [2, -1])
async def test_only_depths_0_and_1_are_accepted(depth: int) -> None:
    from pydantic import ValidationError

    from tests.configs import builtin_config

    with pytest.raises(ValidationError, match="overlap_depth"):
        builtin_config(overlap_depth=depth)

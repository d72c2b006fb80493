"""Built-in engine on the real model: sampling params, seeds, aborts, caching, preemption."""

from __future__ import annotations

import asyncio

import pytest

from tests.engine.conftest import EngineFactory, collect, greedy
from tests.in_thread import thread_core
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    GenerateRequest,
    InvalidRequestError,
    SamplingParams,
)


def _tokens(events: list) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


async def test_seed_reproducible_whatever_the_batch(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    sp = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, seed=1234)
    alone = _tokens(await collect(engine, GenerateRequest("a", tuple(chat_prompts[1]), sp)))
    others = [
        GenerateRequest(f"o{i}", tuple(p), SamplingParams(max_tokens=20, temperature=1.0))
        for i, p in enumerate(chat_prompts)
    ]
    target = GenerateRequest("b", tuple(chat_prompts[1]), sp)
    results = await asyncio.gather(collect(engine, target), *(collect(engine, r) for r in others))
    assert _tokens(results[0]) == alone
    other_seed = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, seed=99)
    different = _tokens(
        await collect(engine, GenerateRequest("c", tuple(chat_prompts[1]), other_seed))
    )
    assert different != alone


async def test_max_tokens_min_tokens_ignore_eos_stop_ids(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    p = tuple(chat_prompts[0])
    free = _tokens(await collect(engine, GenerateRequest("f", p, greedy(40))))
    assert free[-1] in engine.info.eos_token_ids  # the model stops by itself
    events = await collect(engine, GenerateRequest("l", p, greedy(3)))
    assert len(_tokens(events)) == 3 and events[-1].finish_reason == "length"
    events = await collect(engine, GenerateRequest("i", p, greedy(len(free) + 5, ignore_eos=True)))
    assert len(_tokens(events)) == len(free) + 5
    events = await collect(engine, GenerateRequest("m", p, greedy(40, min_tokens=len(free) + 2)))
    toks = _tokens(events)
    assert len(toks) >= len(free) + 2
    assert not set(toks[: len(free) + 1]) & set(engine.info.eos_token_ids)
    stop_at = free[2]
    events = await collect(engine, GenerateRequest("s", p, greedy(40, stop_token_ids=(stop_at,))))
    assert _tokens(events) == free[:3]
    assert events[-1].finish_reason == "stop" and events[-1].stop_token_id == stop_at


async def test_logprobs_top_k_and_prompt_logprobs(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    p = tuple(chat_prompts[2])
    events = await collect(
        engine, GenerateRequest("lp", p, greedy(5, logprobs=3, prompt_logprobs=1))
    )
    first = events[0]
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(p) - 1
    assert [e.token_id for e in first.prompt_logprobs] == list(p[1:])
    for ev in events:
        for lp in ev.logprobs or ():
            assert len(lp.top) == 3
            assert lp.top[0][0] == lp.token_id  # greedy picks the best token
            assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


async def test_validation_errors(make_engine: EngineFactory) -> None:
    engine = await make_engine(max_model_len=64)
    with pytest.raises(ContextTooLongError) as e:
        await collect(engine, GenerateRequest("x", tuple(range(1, 60)), greedy(10)))
    assert "64" in str(e.value) and "59" in str(e.value)
    with pytest.raises(InvalidRequestError):
        await collect(engine, GenerateRequest("y", (), greedy(10)))
    with pytest.raises(InvalidRequestError):
        await collect(engine, GenerateRequest("z", (10**7,), greedy(1)))


async def test_abort_frees_blocks_within_a_step(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine(enable_prefix_caching=False)
    gen = engine.generate(
        GenerateRequest("long", tuple(chat_prompts[0]), greedy(500, ignore_eos=True))
    )
    await gen.__anext__()
    await gen.__anext__()
    assert engine.health().running == 1 and engine.health().kv_usage > 0
    await gen.aclose()
    for _ in range(100):
        if engine.health().kv_usage == 0.0 and engine.health().running == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.health().kv_usage == 0.0 and engine.health().running == 0


async def test_prefix_cache_reuses_blocks_same_output(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine(block_size=8)
    p = tuple(chat_prompts[3])
    first = await collect(engine, GenerateRequest("p1", p, greedy(16)))
    assert first[-1].usage is not None and first[-1].usage.cached_tokens == 0
    second = await collect(engine, GenerateRequest("p2", p, greedy(16)))
    cached = second[-1].usage.cached_tokens  # type: ignore[union-attr]
    assert cached == (len(p) - 1) // 8 * 8 and cached > 0
    assert _tokens(second) == _tokens(first)
    h = engine.health()
    assert h.prefix_cache_hits == cached and h.prefix_cache_queries == 2 * len(p)


async def test_preemption_under_tiny_kv_pool_keeps_outputs(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    roomy = await make_engine(enable_prefix_caching=False)
    reqs = [
        GenerateRequest(f"r{i}", tuple(p), greedy(48, ignore_eos=True))
        for i, p in enumerate(chat_prompts)
    ]
    # The reference, without preemption: all six at once (48 decode steps, not 6 x 48).
    expected = [_tokens(r) for r in await asyncio.gather(*(collect(roomy, r) for r in reqs))]
    tight = await make_engine(num_kv_blocks=14, block_size=8, enable_prefix_caching=False)
    results = await asyncio.gather(*(collect(tight, r) for r in reqs))
    assert [_tokens(r) for r in results] == expected
    assert tight.health().preemptions > 0
    with pytest.raises(InvalidRequestError):
        await collect(tight, GenerateRequest("big", tuple(chat_prompts[0]), greedy(200)))


async def test_degenerate_sampling_params_do_not_kill_the_engine(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    p = tuple(chat_prompts[0])
    odd = [
        SamplingParams(max_tokens=4, temperature=5e-324),  # logits / T overflows
        SamplingParams(max_tokens=4, temperature=1.0, repetition_penalty=1e-300),
        SamplingParams(max_tokens=4, temperature=1.0, top_p=1e-12),
        SamplingParams(max_tokens=4, temperature=2.0, min_p=1.0, presence_penalty=2.0),
    ]
    for i, sp in enumerate(odd):
        events = await collect(engine, GenerateRequest(f"odd{i}", p, sp))
        assert events[-1].finish_reason in ("stop", "length")
    assert engine.health().state == "ready"
    greedy_out = _tokens(await collect(engine, GenerateRequest("g", p, greedy(4))))
    tiny_t = _tokens(
        await collect(
            engine, GenerateRequest("t", p, SamplingParams(max_tokens=4, temperature=1e-9))
        )
    )
    assert tiny_t == greedy_out


async def test_slow_consumer_gets_coalesced_events(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    p = tuple(chat_prompts[1])
    sp = greedy(24, ignore_eos=True, logprobs=1)
    fast = await collect(engine, GenerateRequest("fast", p, sp))
    slow_events = []
    async for ev in engine.generate(GenerateRequest("slow", p, sp)):
        slow_events.append(ev)
        if len(slow_events) == 1:  # fall behind: let the engine finish before reading on
            for _ in range(600):
                if engine.health().running == 0:
                    break
                await asyncio.sleep(0.1)
    assert _tokens(slow_events) == _tokens(fast)
    assert len(slow_events) == 2  # the first token, then everything queued behind it as one
    lps = [lp.token_id for ev in slow_events for lp in ev.logprobs or ()]
    assert lps == _tokens(fast)
    assert slow_events[-1].usage is not None and slow_events[-1].usage.completion_tokens == 24


async def test_stream_interval_batches_tokens_same_output(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    """--stream-interval 5: the first token at once, then events of 5 tokens, the remainder with
    the finish; the tokens and logprobs are those of interval 1."""
    sp = greedy(23, ignore_eos=True, logprobs=1)
    prompts = [tuple(p) for p in chat_prompts[:3]]
    one = await make_engine()
    expected = [
        _tokens(await collect(one, GenerateRequest(f"a{i}", p, sp))) for i, p in enumerate(prompts)
    ]
    five = await make_engine(stream_interval=5)
    runs = await asyncio.gather(
        *(collect(five, GenerateRequest(f"b{i}", p, sp)) for i, p in enumerate(prompts))
    )
    for events, want in zip(runs, expected, strict=True):
        assert _tokens(events) == want
        assert [len(ev.token_ids) for ev in events] == [1, 5, 5, 5, 5, 2]
        assert [lp.token_id for ev in events for lp in ev.logprobs or ()] == want
        assert events[-1].finish_reason == "length"
    assert thread_core(five)._interval.holding == 0

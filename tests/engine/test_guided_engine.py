"""Constrained decoding on the built-in engine with the real model: every output conforms."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from tests.engine.conftest import EngineFactory, chat_ids, collect, greedy
from trtllm_gateway.engine.protocol import (
    DisaggParams,
    GenerateRequest,
    GuidedDecoding,
    SamplingParams,
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
COLOR_RE = r"(red|green|blue) [0-9]{1,3}"
LARK = 'start: "The answer is " NUM "."\nNUM: /[0-9]{1,4}/'


_prompt = chat_ids


def _tokens(events: list[Any]) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


def _text(tokenizer: Any, events: list[Any], eos: tuple[int, ...]) -> str:
    return str(tokenizer.decode([t for t in _tokens(events) if t not in eos]))


async def test_json_schema_validates_over_many_seeds(
    make_engine: EngineFactory, tokenizer: Any
) -> None:
    engine = await make_engine()
    p = _prompt(tokenizer, "Describe a person as JSON with name, age, role, address, tags.")
    guided = GuidedDecoding("json", json.dumps(PERSON))
    reqs = [
        GenerateRequest(
            f"j{seed}",
            p,
            SamplingParams(max_tokens=160, temperature=0.8, seed=seed, guided=guided),
        )
        for seed in range(12)
    ]
    # n>1 as the router sends it: more requests of one prompt, each with its own matcher; two
    # with the same seed must agree token for token (no matcher state is shared).
    twin = replace(reqs[0], request_id="twin")
    results = await asyncio.gather(*(collect(engine, r) for r in [*reqs, twin]))
    assert _tokens(results[-1]) == _tokens(results[0])
    outputs = set()
    for events in results:
        assert events[-1].finish_reason == "stop"
        doc = json.loads(_text(tokenizer, events, engine.info.eos_token_ids))
        jsonschema.validate(doc, PERSON)
        outputs.add(json.dumps(doc))
    assert len(outputs) > 1  # the seeds really sampled


async def test_json_object_regex_and_lark(make_engine: EngineFactory, tokenizer: Any) -> None:
    engine = await make_engine()
    eos = engine.info.eos_token_ids
    cases = [
        ("Name a color and a number.", GuidedDecoding("regex", COLOR_RE), COLOR_RE),
        ("What is 6 times 7?", GuidedDecoding("grammar", LARK), r"The answer is [0-9]{1,4}\."),
    ]
    for i, (text, guided, pattern) in enumerate(cases):
        for seed in range(4):
            sp = SamplingParams(max_tokens=60, temperature=0.8, seed=seed, guided=guided)
            req = GenerateRequest(f"c{i}-{seed}", _prompt(tokenizer, text), sp)
            events = await collect(engine, req)
            out = _text(tokenizer, events, eos)
            assert events[-1].finish_reason == "stop", out
            assert re.fullmatch(pattern, out), out
    # Any JSON object: free-form keys and strings let a 135M model ramble until max_tokens
    # (then the text is cut, as with any server: e.g. "a JSON object about cats" repeats an
    # array item greedily), so these are prompts it answers in a few tokens.
    prompts = [
        "Describe Paris as JSON.",
        "Return a JSON object with your name.",
        "Output a JSON object with keys a and b.",
    ]
    for i, text in enumerate(prompts):
        sp = greedy(200, guided=GuidedDecoding("json_object"))
        events = await collect(engine, GenerateRequest(f"o{i}", _prompt(tokenizer, text), sp))
        out = _text(tokenizer, events, eos)
        assert events[-1].finish_reason == "stop", out
        assert isinstance(json.loads(out), dict)


async def test_constrained_with_logprobs_and_stop_token(
    make_engine: EngineFactory, tokenizer: Any
) -> None:
    engine = await make_engine()
    p = _prompt(tokenizer, "Name a color and a number.")
    guided = GuidedDecoding("regex", COLOR_RE)
    events = await collect(engine, GenerateRequest("lp", p, greedy(20, logprobs=2, guided=guided)))
    toks = _tokens(events)
    lps = [lp for ev in events for lp in ev.logprobs or ()]
    assert [lp.token_id for lp in lps] == toks
    assert all(len(lp.top) == 2 and lp.logprob <= 0.0 for lp in lps)
    # A stop token the grammar allows ends the request there, as without a constraint.
    stop_at = toks[1]
    events = await collect(
        engine, GenerateRequest("st", p, greedy(20, guided=guided, stop_token_ids=(stop_at,)))
    )
    assert _tokens(events) == toks[:2] and events[-1].finish_reason == "stop"


async def test_preemption_and_chunked_prefill_keep_constrained_outputs(
    make_engine: EngineFactory, tokenizer: Any, chat_prompts: list[list[int]]
) -> None:
    guided = GuidedDecoding("json", json.dumps(PERSON))
    reqs = [
        GenerateRequest(f"r{i}", tuple(p), greedy(48, guided=guided))
        for i, p in enumerate(chat_prompts[:4])
    ]
    roomy = await make_engine(enable_prefix_caching=False)
    # The reference, without preemption or chunks: all four at once (48 steps, not 4 x 48).
    expected = [_tokens(r) for r in await asyncio.gather(*(collect(roomy, r) for r in reqs))]
    tight = await make_engine(num_kv_blocks=14, block_size=8, enable_prefix_caching=False)
    results = await asyncio.gather(*(collect(tight, r) for r in reqs))
    assert [_tokens(r) for r in results] == expected
    assert tight.health().preemptions > 0
    chunked = await make_engine(max_num_tokens=16, enable_prefix_caching=False)
    results = await asyncio.gather(*(collect(chunked, r) for r in reqs))
    assert [_tokens(r) for r in results] == expected


async def test_start_after_leaves_the_reasoning_free(
    make_engine: EngineFactory, chat_prompts: list[list[int]], tokenizer: Any
) -> None:
    engine = await make_engine()
    p = tuple(chat_prompts[0])
    free = _tokens(await collect(engine, GenerateRequest("free", p, greedy(12))))
    marker = (free[2],)
    guided = GuidedDecoding("regex", COLOR_RE, start_after=marker)
    events = await collect(engine, GenerateRequest("sa", p, greedy(40, guided=guided)))
    toks = _tokens(events)
    assert toks[:3] == free[:3]  # unconstrained up to and including the marker
    rest = [t for t in toks[3:] if t not in engine.info.eos_token_ids]
    assert re.fullmatch(COLOR_RE, tokenizer.decode(rest))


async def test_logit_bias_and_allowed_token_ids(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    engine = await make_engine()
    p = tuple(chat_prompts[0])
    free = _tokens(await collect(engine, GenerateRequest("free", p, greedy(6))))
    forced = 1000
    out = _tokens(
        await collect(engine, GenerateRequest("plus", p, greedy(4, logit_bias=((forced, 100.0),))))
    )
    assert out == [forced] * 4
    banned = _tokens(
        await collect(
            engine, GenerateRequest("minus", p, greedy(6, logit_bias=((free[0], -100.0),)))
        )
    )
    assert free[0] not in banned
    allowed = (300, 301, 302)
    sp = SamplingParams(max_tokens=8, temperature=1.0, seed=3, allowed_token_ids=allowed)
    out = _tokens(await collect(engine, GenerateRequest("allow", p, sp)))
    assert len(out) == 8 and set(out) <= set(allowed)


async def test_remote_prefill_constrains_both_sides(
    make_engine: EngineFactory, tokenizer: Any
) -> None:
    prefill = await make_engine(block_size=8)
    decode = await make_engine(block_size=8)
    p = _prompt(tokenizer, "Name a color and a number.")
    guided = GuidedDecoding("regex", COLOR_RE)
    # Greedy: a CPU generator's draws after the sibling's first token are not the aggregated
    # run's, so seeded sampling would differ across the split for reasons not about guidance.
    req = GenerateRequest("rp", p, greedy(20, guided=guided))
    expected = _tokens(await collect(decode, replace(req, request_id="agg")))
    res = await prefill.prefill(req)
    blob = await prefill.pull_kv(req.request_id)
    disagg = DisaggParams("generation_only", res.first_token_ids, None, "rp", None, blob)
    got = _tokens(await collect(decode, replace(req, disagg=disagg)))
    assert got == expected
    free = _tokens(await collect(decode, GenerateRequest("free", p, greedy(1))))
    assert res.first_token_ids[0] != free[0]  # the prefill side constrained its token too
    eos = decode.info.eos_token_ids
    assert re.fullmatch(COLOR_RE, tokenizer.decode([t for t in got if t not in eos]))


@pytest.mark.parametrize("bad", ["{", "[unclosed"])
async def test_invalid_constraint_is_refused_before_running(
    make_engine: EngineFactory, chat_prompts: list[list[int]], bad: str
) -> None:
    from trtllm_gateway.engine.protocol import InvalidRequestError

    engine = await make_engine()
    kind = "json" if bad == "{" else "regex"
    sp = greedy(4, guided=GuidedDecoding(kind, bad))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError) as exc:
        await collect(engine, GenerateRequest("bad", tuple(chat_prompts[0]), sp))
    assert exc.value.param is not None


async def test_constraint_that_fails_on_the_tokenizer_names_its_param(
    make_engine: EngineFactory, chat_prompts: list[list[int]]
) -> None:
    """a{1000000} compiles (check_guided passes) but llguidance refuses it once built over the
    model's tokenizer: still the request's 400, naming the constraint (found by the fuzz)."""
    from trtllm_gateway.engine.protocol import InvalidRequestError

    engine = await make_engine()
    sp = greedy(4, guided=GuidedDecoding("regex", "a{1000000}"))
    with pytest.raises(InvalidRequestError) as exc:
        await collect(engine, GenerateRequest("huge", tuple(chat_prompts[0]), sp))
    assert exc.value.param == "structured_outputs.regex"
    assert engine.health().state == "ready"

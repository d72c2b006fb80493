"""Logits processors on the built-in engine with the real default model (engine/logits).

The seeds' own check (NVIDIA Dynamo, tests/serve/test_trtllm.py
test_chat_only_aggregated_with_test_logits_processor: DYNAMO_ENABLE_TEST_LOGITS_PROCESSOR=1 and
the answer holds "Hello world!") is reproduced with GATEWAY_ENABLE_TEST_LOGITS_PROCESSOR=1; a
processor loaded by path runs on the rows whose vllm_xargs select it, in one call per step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from tests.engine.conftest import EngineFactory, chat_ids, collect, greedy
from trtllm_gateway.engine.logits.load import TEST_PROCESSOR
from trtllm_gateway.engine.logits.processor import ExtraArgs, LogitsProcessor, Row
from trtllm_gateway.engine.protocol import (
    GenerateRequest,
    InvalidRequestError,
    RequestFailedError,
    SamplingParams,
)

HERE = "tests.engine.test_logits_processors"
DOCSTRING_BAN = "tests.engine.docstring_processor:Ban"  # the docstring's own example


class BanFirstChoice(LogitsProcessor[list[int]]):
    """Bans, at every step, the token the model liked best at the first step (vllm_xargs
    "ban_first": any value); records how many rows each call got. "boom" makes apply raise."""

    calls: list[int] = []  # noqa: RUF012  (the test reads it; one engine in this process)

    def new_state(self, prompt_token_ids: Sequence[int], args: ExtraArgs) -> list[int] | None:
        if "ban_first" not in args:
            return None
        if args["ban_first"] == "bad":
            raise ValueError("ban_first must not be 'bad'")
        return [-1 if args["ban_first"] != "boom" else -2]

    def apply(self, logits: torch.Tensor, rows: Sequence[Row[list[int]]]) -> None:
        type(self).calls.append(len(rows))
        for i, row in enumerate(rows):
            if row.state[0] == -2:
                raise RuntimeError("boom")
            if row.state[0] < 0:
                row.state[0] = int(logits[i].argmax())
            logits[i, row.state[0]] = float("-inf")


class SetupBug(LogitsProcessor[int]):
    """A processor whose own setup is broken (vllm_xargs "setup_bug" selects it)."""

    def new_state(self, prompt_token_ids: Sequence[int], args: ExtraArgs) -> int | None:
        if "setup_bug" in args:
            raise RuntimeError("the processor's own bug")
        return None

    def apply(self, logits: torch.Tensor, rows: Sequence[Row[int]]) -> None:
        pass


def _ids(events: list[Any]) -> list[int]:
    return [t for ev in events for t in ev.token_ids]


async def test_seeds_test_processor_answers_hello_world_to_every_request(
    make_engine: EngineFactory, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_ENABLE_TEST_LOGITS_PROCESSOR", "1")  # read by Settings
    engine = await make_engine()
    eos = engine.info.eos_token_ids
    reqs = [
        GenerateRequest(
            "greedy", chat_ids(tokenizer, "What is the capital of France?"), greedy(32)
        ),
        GenerateRequest(
            "sampled",
            chat_ids(tokenizer, "Write a haiku about the sea."),
            SamplingParams(max_tokens=32, temperature=1.0, seed=7),
        ),
    ]
    for events in await asyncio.gather(*(collect(engine, r) for r in reqs)):
        ids = _ids(events)
        assert tokenizer.decode([t for t in ids if t not in eos]) == "Hello world!"
        assert events[-1].finish_reason == "stop" and ids[-1] in eos


async def test_processor_by_path_changes_only_the_requests_that_select_it(
    make_engine: EngineFactory, tokenizer: Any
) -> None:
    engine = await make_engine(logits_processor=[TEST_PROCESSOR, f"{HERE}:BanFirstChoice"])
    prompt = chat_ids(tokenizer, "What is the capital of France?")
    plain = _ids(await collect(engine, GenerateRequest("base", prompt, greedy(12))))
    BanFirstChoice.calls.clear()
    hello = GenerateRequest("hello", prompt, greedy(12, extra_args=(("hello_world", 1),)))
    banned = GenerateRequest("ban", prompt, greedy(12, extra_args=(("ban_first", "x"),)))
    other = GenerateRequest("other", prompt, greedy(12, extra_args=(("unrelated", 1.5),)))
    out = await asyncio.gather(*(collect(engine, r) for r in (hello, banned, other)))
    eos = engine.info.eos_token_ids
    assert tokenizer.decode([t for t in _ids(out[0]) if t not in eos]) == "Hello world!"
    assert _ids(out[2]) == plain  # selected nothing: the batch did not touch it
    ban = _ids(out[1])
    assert ban[0] != plain[0] and plain[0] not in ban  # banned at every step
    assert BanFirstChoice.calls and max(BanFirstChoice.calls) == 1  # only its own row


async def test_one_call_per_step_for_all_rows_and_failures_stay_per_request(
    make_engine: EngineFactory, tokenizer: Any
) -> None:
    engine = await make_engine(logits_processor=[f"{HERE}:BanFirstChoice"])
    prompts = [chat_ids(tokenizer, t) for t in ("Name a color.", "Name a fruit.", "Name a tree.")]
    BanFirstChoice.calls.clear()
    reqs = [
        GenerateRequest(f"b{i}", p, greedy(8, extra_args=(("ban_first", i),)))
        for i, p in enumerate(prompts)
    ]
    await asyncio.gather(*(collect(engine, r) for r in reqs))
    assert max(BanFirstChoice.calls) == 3  # the batch-level call: three rows at once

    with pytest.raises(InvalidRequestError) as refused:
        await collect(
            engine,
            GenerateRequest("bad", prompts[0], greedy(4, extra_args=(("ban_first", "bad"),))),
        )
    assert refused.value.param == "vllm_xargs" and "must not be 'bad'" in str(refused.value)

    boom = GenerateRequest("boom", prompts[0], greedy(8, extra_args=(("ban_first", "boom"),)))
    fine = GenerateRequest("fine", prompts[1], greedy(8))
    results = await asyncio.gather(
        collect(engine, boom), collect(engine, fine), return_exceptions=True
    )
    # The processor's own bug in apply: a 500 for its request (it was a 400 before issue 40).
    assert isinstance(results[0], RequestFailedError) and "boom" in str(results[0])
    assert isinstance(results[1], list) and results[1][-1].finish_reason == "length"


async def test_whatever_a_processor_raises_in_setup_fails_only_its_request(
    make_engine: EngineFactory, tokenizer: Any
) -> None:
    """Issue 40 item 2: the docstring's example with {"ban": [1, 2]} raised TypeError in setup,
    which ended the engine core (every stream 503, the server exited)."""
    engine = await make_engine(logits_processor=[DOCSTRING_BAN, f"{HERE}:SetupBug"])
    prompts = [chat_ids(tokenizer, t) for t in ("Name a color.", "Name a fruit.")]
    victims = [GenerateRequest(f"v{i}", p, greedy(8)) for i, p in enumerate(prompts)]
    alone = [_ids(await collect(engine, v)) for v in victims]
    vocab = engine.info.vocab_size
    attacks = {
        "list": (("ban", (1, 2)),),  # int([1, 2]): TypeError
        "text": (("ban", "seven"),),  # int("seven"): ValueError
        "past-vocab": (("ban", vocab + 5),),  # would index past the logits in apply
        "bug": (("setup_bug", 1),),  # the processor's own RuntimeError
    }
    reqs = [GenerateRequest(k, prompts[0], greedy(8, extra_args=a)) for k, a in attacks.items()]
    again = [GenerateRequest(f"w{i}", p, greedy(8)) for i, p in enumerate(prompts)]
    results = await asyncio.gather(
        *(collect(engine, r) for r in (*reqs, *again)), return_exceptions=True
    )
    got = dict(zip(attacks, results, strict=False))
    for name in ("list", "text", "past-vocab"):
        err = got[name]
        assert isinstance(err, InvalidRequestError), (name, err)
        assert err.param == "vllm_xargs" and "ban must be a token id" in str(err), err
    assert isinstance(got["bug"], RequestFailedError) and "own bug" in str(got["bug"])
    assert [_ids(r) for r in results[len(reqs) :]] == alone  # type: ignore[arg-type]
    # A valid ban works: the token the model wanted first is never sampled.
    first = alone[0][0]
    banned = await collect(
        engine, GenerateRequest("ok", prompts[0], greedy(8, extra_args=(("ban", first),)))
    )
    assert first not in _ids(banned)

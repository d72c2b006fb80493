"""The official openai SDK against the real server: the vertical slice, end to end.

Runs twice: on the built-in engine with the real SmolLM2, and on the TensorRT-LLM adapter over
the stand-in `tensorrt_llm` (tests/standin), whose tokens are deterministic but meaningless, so
checks of the answer's meaning apply to the built-in engine only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.server import Server
from tests.standin import standin_env
from trtllm_gateway.engine.logits.load import TEST_PROCESSOR

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=["builtin", "trtllm-standin"])
def engine_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def sdk_server(engine_kind: str, server: Server, log_dir: Path) -> Iterator[Server]:
    if engine_kind == "builtin":
        yield server
        return
    args = ["--engine", "trtllm", "--guided-decoding-backend", "llguidance"]
    args += ["--logits-processor", TEST_PROCESSOR]  # as the built-in server has it
    srv = Server(args=args, env=standin_env()).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(sdk_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sdk_server.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_default_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_non_streaming_answers(client: openai.OpenAI, engine_kind: str) -> None:
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=80)
    choice = r.choices[0]
    assert choice.message.content
    if engine_kind == "builtin":
        assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 10


def test_chat_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=80
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=80,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]


def test_completions_and_echo(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert r.choices[0].text.strip() and r.choices[0].finish_reason == "length"
    e = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0, echo=True
    )
    assert e.choices[0].text == "The capital of France is" + r.choices[0].text


def test_n2_gives_two_indexed_choices(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=QUESTION, n=2, max_tokens=12, temperature=1.0, seed=7
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, n=2, max_tokens=12, temperature=1.0, seed=7, stream=True
    )
    texts = {0: "", 1: ""}
    for c in stream:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts == {c.index: c.message.content for c in r.choices}


def test_stop_strings(client: openai.OpenAI) -> None:
    base = (
        client.completions.create(
            model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0
        )
        .choices[0]
        .text
    )
    stop = base.strip()[:3].strip() or base[:2]
    cut = client.completions.create(
        model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=20, temperature=0, stop=[stop]
    ).choices[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert base.startswith(cut.text)


def test_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    for tok in content:
        assert len(tok.top_logprobs) == 3
        assert tok.logprob <= 0 and tok.top_logprobs[0].logprob >= tok.logprob - 1e-6
        assert tok.bytes is not None


def test_logprobs_without_alternatives(client: openai.OpenAI) -> None:
    """logprobs=True alone, and completions logprobs=0: the chosen token's logprob, no top
    (TensorRT-LLM treats 0 as "none"; the adapter asks for 20 and trims). Greedy: at a sampling
    temperature TensorRT-LLM may not return the sampled token's value (null, docs/trtllm.md)."""
    r = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=4, logprobs=True
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    assert all(tok.logprob <= 0 and tok.top_logprobs == [] for tok in content)
    c = client.completions.create(
        model=MODEL, prompt="Paris is", max_tokens=4, logprobs=0, temperature=0
    )
    lps = c.choices[0].logprobs
    assert lps is not None and lps.token_logprobs is not None
    assert len(lps.token_logprobs) == c.usage.completion_tokens  # type: ignore[union-attr]
    assert all(lp is not None and lp <= 0 for lp in lps.token_logprobs)


def test_structured_outputs_reach_the_engine(client: openai.OpenAI) -> None:
    """A choice comes back as one of its words and json_object opens an object, on both
    engines (TensorRT-LLM: GuidedDecodingParams under guided_decoding_backend=llguidance)."""
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
        max_tokens=8,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert r.choices[0].message.content in ("yes", "no")
    r = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, response_format={"type": "json_object"}
    )
    assert (r.choices[0].message.content or "").lstrip().startswith("{")


def test_logits_processor_selected_by_vllm_xargs(client: openai.OpenAI) -> None:
    """The seeds' HelloWorld processor, loaded by path, answers the request that selects it on
    either engine (the built-in sampler; TensorRT-LLM's logits post-processor hook)."""
    kw: dict[str, Any] = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 24}
    r = client.chat.completions.create(**kw, extra_body={"vllm_xargs": {"hello_world": True}})
    assert r.choices[0].message.content == "Hello world!"
    assert r.choices[0].finish_reason == "stop"
    other = client.chat.completions.create(**kw)
    assert other.choices[0].message.content != "Hello world!"


def test_seed_reproducible(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "messages": QUESTION, "max_tokens": 16, "temperature": 1.0}
    a = client.chat.completions.create(seed=42, **kw).choices[0].message.content  # type: ignore[call-overload]
    b = client.chat.completions.create(seed=42, **kw).choices[0].message.content  # type: ignore[call-overload]
    assert a == b


def test_sdk_raises_its_own_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10**6)
    assert "8192" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=-1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])

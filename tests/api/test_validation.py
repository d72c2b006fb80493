"""Hostile input at the HTTP edge (routers/openai/validation.py, engine/tokenizer.py), in process
over the
FakeEngine: every token id against the vocabulary, logit_bias / allowed_token_ids reaching the
engine, lone surrogates, deep nesting, NaN/Infinity, reserved chat_template_kwargs. Each is a
400 naming the param, never a 500."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import MODEL
from tests.fake_engine import FakeEngine
from trtllm_gateway.engine.protocol import GenerateRequest, TokenEvent
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.validation import (
    MAX_CHOICES,
    MAX_DEPTH,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
)

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def cmpl(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hello", **extra}


async def post_raw(client: httpx.AsyncClient, url: str, text: str) -> httpx.Response:
    return await client.post(url, content=text, headers={"content-type": "application/json"})


def assert_400(r: httpx.Response, param: str | None) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["type"] == "BadRequestError"
    assert error["param"] == param, error
    return error


@pytest.fixture
def seen(fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> list[GenerateRequest]:
    """The GenerateRequests the engine received."""
    requests: list[GenerateRequest] = []
    generate = fake_engine.generate

    def record(req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        requests.append(req)
        return generate(req)

    monkeypatch.setattr(fake_engine, "generate", record)
    return requests


@pytest.mark.parametrize("url", [CHAT, CMPL])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stop_token_ids", [-100000]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [2**70]),
        ("allowed_token_ids", [3, 10**6]),
        ("allowed_token_ids", []),
        ("logit_bias", {"-1": 5}),
        ("logit_bias", {str(2**70): 5}),
        ("logit_bias", {"hello": 5}),
        ("logit_bias", {"1.5": 5}),
        ("logit_bias", {"\u0665": 5}),  # an Arabic-Indic digit: int() reads it, OpenAI does not
    ],
)
async def test_token_ids_outside_the_vocabulary(
    client: httpx.AsyncClient, seen: list[GenerateRequest], url: str, field: str, value: Any
) -> None:
    body = chat(**{field: value}) if url == CHAT else cmpl(**{field: value})
    assert_400(await client.post(url, json=body), field)
    assert seen == []


async def test_vocab_bound_is_the_engine_vocab(
    client: httpx.AsyncClient, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    vocab = fake_engine.info.vocab_size
    assert vocab == tokenizer.vocab_size
    ok = await client.post(CMPL, json=cmpl(stop_token_ids=[0, vocab - 1], max_tokens=2))
    assert ok.status_code == 200, ok.text
    error = assert_400(await client.post(CMPL, json=cmpl(stop_token_ids=[vocab])), "stop_token_ids")
    assert f"[0, {vocab})" in error["message"]


@pytest.mark.parametrize("prompt", [[-1], [2**70], [[1, 2], [3, -5]], [1, 10**9]])
async def test_prompt_token_ids(client: httpx.AsyncClient, prompt: list[Any]) -> None:
    assert_400(await client.post(CMPL, json=cmpl(prompt=prompt)), "prompt")


@pytest.mark.parametrize("url", [CHAT, CMPL])
async def test_logit_bias_and_allowed_ids_reach_the_engine(
    client: httpx.AsyncClient, seen: list[GenerateRequest], url: str
) -> None:
    extra = {"logit_bias": {"5": 250, "7": -1e9, "9": 0.5}, "allowed_token_ids": [9, 5, 9]}
    body = chat(**extra) if url == CHAT else cmpl(**extra)
    r = await client.post(url, json=body)
    assert r.status_code == 200, r.text
    (req,) = seen
    assert req.sampling.logit_bias == ((5, 100.0), (7, -100.0), (9, 0.5))  # clamped like OpenAI
    assert req.sampling.allowed_token_ids == (9, 5, 9)


@pytest.mark.parametrize("url", [CHAT, CMPL])
async def test_vllm_xargs_reach_the_engine(
    client: httpx.AsyncClient, seen: list[GenerateRequest], url: str
) -> None:
    xargs = {"hello_world": True, "ban": [5, "x", 1.5], "name": "n"}
    body = chat(vllm_xargs=xargs) if url == CHAT else cmpl(vllm_xargs=xargs)
    r = await client.post(url, json=body)
    assert r.status_code == 200, r.text
    (req,) = seen
    # vLLM's type (str | int | float | list of them): a JSON true is read as 1, as pydantic does.
    assert req.sampling.extra_args == (("hello_world", 1), ("ban", (5, "x", 1.5)), ("name", "n"))


@pytest.mark.parametrize("xargs", [{"a": {"nested": 1}}, {"a": None}, {"a": [[1]]}, ["a"], "a=1"])
async def test_vllm_xargs_hold_strings_numbers_or_lists_of_them(
    client: httpx.AsyncClient, xargs: object
) -> None:
    r = await client.post(CMPL, json=cmpl(vllm_xargs=xargs))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("vllm_xargs"), r.text


async def test_nan_vllm_xargs(client: httpx.AsyncClient) -> None:
    r = await post_raw(client, CMPL, '{"prompt": "a", "vllm_xargs": {"t": NaN}}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("vllm_xargs"), r.text


@pytest.mark.parametrize(
    ("url", "text", "param"),
    [
        (CHAT, '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages"),
        (CHAT, '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
         "messages"),
        (CMPL, '{"prompt": "a\\ud800b"}', "prompt"),
        (CMPL, '{"prompt": ["ok", "\\udc00"]}', "prompt"),
        (CMPL, '{"prompt": "a", "stop": ["\\ud800"]}', "stop"),
        (CHAT, '{"messages": [{"role": "user", "content": "x"}], '
               '"chat_template_kwargs": {"\\ud800": 1}}', "chat_template_kwargs"),
    ],
)  # fmt: skip
async def test_lone_surrogates(client: httpx.AsyncClient, url: str, text: str, param: str) -> None:
    error = assert_400(await post_raw(client, url, text), param)
    assert "surrogate" in error["message"]


async def test_surrogate_pairs_are_text(client: httpx.AsyncClient) -> None:
    r = await post_raw(client, CMPL, '{"prompt": "smile \\ud83d\\ude00", "max_tokens": 2}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "field", ["temperature", "top_p", "presence_penalty", "repetition_penalty", "min_p"]
)
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
async def test_nan_and_infinity(client: httpx.AsyncClient, field: str, value: str) -> None:
    assert_400(await post_raw(client, CMPL, f'{{"prompt": "a", "{field}": {value}}}'), field)


async def test_nan_logit_bias(client: httpx.AsyncClient) -> None:
    r = await post_raw(client, CMPL, '{"prompt": "a", "logit_bias": {"5": NaN}}')
    assert_400(r, "logit_bias.5")  # pydantic's location of the value, as for other fields


def nested(depth: int) -> Any:
    return json.loads("[" * depth + "]" * depth)


@pytest.mark.parametrize(
    ("url", "body", "param"),
    [
        (CHAT, chat(chat_template_kwargs={"x": nested(500)}), "chat_template_kwargs"),
        (CHAT, chat(messages=[{"role": "user", "content": "x", "extra": nested(500)}]), "messages"),
        (CMPL, cmpl(anything=nested(MAX_DEPTH + 5)), "anything"),
    ],
)
async def test_deep_nesting(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], param: str
) -> None:
    error = assert_400(await client.post(url, json=body), param)
    assert "nested" in error["message"]


async def test_nesting_under_the_limit_passes(client: httpx.AsyncClient) -> None:
    body = chat(messages=[{"role": "user", "content": "x", "extra": nested(MAX_DEPTH - 8)}])
    r = await client.post(CHAT, json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "kwarg",
    ["tokenize", "return_dict", "conversation", "messages", "add_generation_prompt", "tools",
     "chat_template", "continue_final_message", "return_tensors", "tokenizer_kwargs"],
)  # fmt: skip
async def test_reserved_chat_template_kwargs(client: httpx.AsyncClient, kwarg: str) -> None:
    r = await client.post(CHAT, json=chat(chat_template_kwargs={kwarg: False}))
    assert kwarg in assert_400(r, "chat_template_kwargs")["message"]


async def test_other_chat_template_kwargs_pass(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=chat(chat_template_kwargs={"enable_thinking": False}))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("prompt", "n"), [(["a"] * (MAX_CHOICES + 1), 1), ([[1, 2]] * 17, 128), (["a"] * 200_000, 1)]
)
async def test_too_many_choices(
    client: httpx.AsyncClient, seen: list[GenerateRequest], prompt: list[Any], n: int
) -> None:
    error = assert_400(await client.post(CMPL, json=cmpl(prompt=prompt, n=n)), "prompt")
    assert str(MAX_CHOICES) in error["message"]
    assert seen == []


@pytest.mark.parametrize("url", [CHAT, CMPL])
async def test_stop_strings_are_bounded(client: httpx.AsyncClient, url: str) -> None:
    """Issue 40, item 4: 12,000 stop strings are a 400, not a stalled event loop; as many as
    the bound (and as many characters) are served."""
    body = chat if url == CHAT else cmpl
    many = [f"{i:04d}" for i in range(12000)]
    error = assert_400(await client.post(url, json=body(stop=many)), "stop")
    assert str(MAX_STOP_STRINGS) in error["message"]
    long = ["x" * (MAX_STOP_CHARS // 2 + 1)] * 2
    assert_400(await client.post(url, json=body(stop=long)), "stop")
    at_bound = [f"q{i:03d}" for i in range(MAX_STOP_STRINGS)]
    assert (await client.post(url, json=body(stop=at_bound, max_tokens=2))).status_code == 200
